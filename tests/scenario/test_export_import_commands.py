"""nmt-export and nmt-import as commands, against a trained run (docs/reliability.md, export and
import rows): a refused setting or a run that would be overwritten is one error line, exit
status 2, and the run is left as it was."""

from __future__ import annotations

import subprocess
import sys

from unit.interop import test_export_import as exports

spm_model = exports.spm_model
post_norm = exports.post_norm
hf_dir = exports.hf_dir
_checkpoint, _cli = exports._checkpoint, exports._cli
_one_error_line, _fake_run = exports._one_error_line, exports._fake_run


def test_nmt_export_cli_refuses_with_one_line(spm_model, tmp_path):
    pre = _checkpoint(tmp_path / "pre.pt", ["model.norm=pre"])
    proc = subprocess.run(
        [sys.executable, "-m", "transformer_nmt.cli.export", f"decode.checkpoint={pre}",
         f"data.root={tmp_path}", f"run_dir={tmp_path}/run", "hydra.run.dir=" + str(tmp_path)],
        check=False, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: model.norm=pre")
    assert "Traceback" not in proc.stderr


def test_24_01_16_nmt_export_onto_its_run_is_one_line_and_keeps_the_run(post_norm, spm_model,
                                                                        tmp_path):
    run = tmp_path / "run"
    before = _fake_run(run, post_norm)
    (tmp_path / "spm" / "multi30k_en_de").mkdir(parents=True)
    (tmp_path / "spm" / "multi30k_en_de" / "spm.model").write_bytes(spm_model.read_bytes())
    proc = _cli("export", f"run_dir={run}", f"export.output={run}", f"data.root={tmp_path}",
                "export.overwrite=true")
    assert _one_error_line(proc).startswith(f"error: export output {run} exists and is not an "
                                            "export folder written by nmt-export")
    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != "export.log"}
    assert after == before  # the run as it was, no .hydra files left


def test_24_02_16_nmt_import_into_a_trained_run_is_refused(hf_dir, post_norm, tmp_path):
    run = tmp_path / "run"
    before = _fake_run(run, post_norm)
    proc = _cli("import_model", f"export.source={hf_dir}", f"run_dir={run}",
                f"data.root={tmp_path}", "data.name=imported")
    assert _one_error_line(proc) == (
        f"error: {run} already holds checkpoints (checkpoint_7.pt in {run / 'checkpoints'}); "
        "import under another name= (or run_dir=), or pass export.overwrite=true to replace "
        "averaged.pt")
    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()
             and p.name != "import_model.log"}
    assert after == before
    assert not (tmp_path / "spm").exists()


def test_nmt_import_of_a_truncated_config_json_is_one_line_and_leaves_nothing(hf_dir, tmp_path):
    import shutil

    folder = tmp_path / "src"
    shutil.copytree(hf_dir, folder)
    (folder / "config.json").write_text((hf_dir / "config.json").read_text()[:100])
    run = tmp_path / "run"
    proc = _cli("import_model", f"export.source={folder}", f"run_dir={run}",
                f"data.root={tmp_path}", "data.name=imported")
    assert _one_error_line(proc).startswith(f"error: {folder / 'config.json'}: not valid JSON (")
    assert not run.exists() and not (tmp_path / "spm").exists()
