"""``train(cfg)``: the paper's training recipe (section 5) as setup, a :class:`TrainState` and one
loop.

The same loop runs for every world size (one CPU process, one GPU, ``torchrun`` on many
GPUs or nodes); with world size 1 every collective of :mod:`transformer_nmt.train.distributed` is
a no-op. One optimizer ``step`` = ``update_freq`` micro-batches (``micro_step``) per rank; a
rank without a batch for a micro-step runs a zero-weight dummy batch so it joins every
all-reduce. The parts: :mod:`~transformer_nmt.train.setup` builds the run,
:mod:`~transformer_nmt.train.step` computes each step's gradient and update (skipping
non-finite steps on the device), :mod:`~transformer_nmt.train.state` holds the counters and
limits, and :mod:`~transformer_nmt.train.summary` writes ``train_summary.json``.

Each step's figures (losses, gradient norm, token counts, the ranks' stop and save requests)
are read one step late, after the next step's forward and backward are queued, so the device
never waits while the host prepares a step; a step that may be validated, saved or end the
run is read at once (:func:`~transformer_nmt.train.state.needs_exact_state`). Details:
docs/training.md.

Checkpoints (rank 0 writes; parts in :mod:`transformer_nmt.checkpoint`) restore a run
bit-for-bit on the same world size; an unreadable newest checkpoint is skipped for the one
before it. SIGTERM / SIGUSR1 / SIGUSR2 / SIGINT (Ctrl-C) stop the run at the next step boundary
with a checkpoint (with several ranks, the one after: :func:`requests_known_at_once`); a run
resumed after it finished does nothing. The prepared data is read, never made
(``nmt-prepare``). See docs/training.md.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from transformer_nmt.config import Config
from transformer_nmt.runtime import STOP_SIGNALS, StopFlag, device_name
from transformer_nmt.train import distributed, resume, startup_signals
from transformer_nmt.train.metrics import MetricsLog, Window, log_train_line
from transformer_nmt.train.setup import setup
from transformer_nmt.train.state import (
    TrainState,
    finished_by,
    needs_exact_state,
    reached_limit,
    should_save,
    should_validate,
)
from transformer_nmt.train.step import (
    PendingStep,
    TrainingDiverged,
    finish_update,
    forward_backward,
    queue_update,
)
from transformer_nmt.train.summary import write_summary
from transformer_nmt.train.validation import run_validation, valid_references
from transformer_nmt.train.whole_step import build_whole_step

log = logging.getLogger(__name__)


def train(cfg: Config, *, model_vocab_size: int | None = None,
          valid_max_batches: int | None = None) -> dict[str, Any]:
    """Train ``cfg.model`` on ``cfg.data`` with ``cfg.trainer``; resume when the run has
    checkpoints.

    A resumed run that has already finished (:func:`finished_by`) takes no step, validates
    and saves nothing, and rewrites ``train_summary.json`` with ``"already_finished": true``.

    Args:
        cfg: the composed, validated config (``config.validate`` already called); the
            prepared data must exist (``nmt-prepare``).
        model_vocab_size: build the model with at least this vocabulary (dry runs).
        valid_max_batches: validate on at most this many batches per rank (dry runs).

    Returns:
        The run summary, also written to ``<run_dir>/train_summary.json`` (rank 0): steps,
        tokens_seen, train_seconds, world_size, device, gpu_hours, flops, stopped_by, ...

    Raises:
        MissingDataError: the prepared data is missing (one line naming the file).
        TrainingDiverged (a RuntimeError): ``max_bad_steps`` consecutive non-finite steps or
            a collapsed fp16 loss scale; ``train_summary.json`` is written first, with
            ``"stopped_by": "divergence"`` and ``last_finite_checkpoint``.
        ValueError: ``trainer.dry_run`` set (dry runs go through
            :func:`transformer_nmt.train.dryrun.dry_run`), bad precision for the device, empty
            training set, or a checkpoint of another layout in the run directory.
        UserError: a ``trainer.resume_changed`` entry that is no setting
            (:func:`transformer_nmt.train.resume.check_resume_changed`); the run directory
            holds another model or was started with other settings, or none of its
            checkpoints can be read
            (:func:`transformer_nmt.train.resume.resume_training`); another ``nmt-train``
            holds the run directory, or it is a file
            (:func:`transformer_nmt.train.resume.run_lock`).
    """
    if cfg.trainer.dry_run:
        raise ValueError("trainer.dry_run=true: run it with nmt-train or "
                         "transformer_nmt.train.dryrun.dry_run(cfg), not train(cfg)")
    resume.check_resume_changed(cfg)
    # the handlers go in before the slow start-up (rendezvous, sampler, model, resume): a
    # stop signal then stops the run before its first step, with a summary
    stop_flag = StopFlag()
    stop_flag.install()
    startup_signals.take_over(stop_flag)
    try:
        info = distributed.init_distributed()
        try:
            with resume.run_lock(cfg.run_dir) if info.is_main else contextlib.nullcontext():
                return _train(cfg, info, stop_flag, model_vocab_size, valid_max_batches)
        finally:
            distributed.cleanup()
    finally:
        stop_flag.restore()


def _train(cfg: Config, info: distributed.DistInfo, stop_flag: StopFlag,
           model_vocab_size: int | None, valid_max_batches: int | None) -> dict[str, Any]:
    t_cfg = cfg.trainer
    run_dir = Path(cfg.run_dir)
    if not info.is_main:
        log.setLevel(logging.WARNING)
    run = setup(cfg, info, model_vocab_size)
    seed, update_freq, epsilon = (int(t_cfg.seed), int(t_cfg.update_freq),
                                  float(t_cfg.label_smoothing))
    state = TrainState(world_size=info.world_size)
    resumed_from = resume.resume_training(run_dir, run, state, seed, info, config=cfg)
    whole = build_whole_step(run, t_cfg) if t_cfg.cuda_graphs else None  # one graph per step
    done = finished_by(t_cfg, state) if resumed_from is not None else None
    if done is not None:  # a requeued or repeated finished run: no step, validation or save
        log.info("the run in %s has already finished (%s reached at step %d): nothing to do; "
                 "raise that limit to train on", run_dir, done, state.step)
        return write_summary(cfg, run, state, info, done, {}, resumed_from, already_finished=True)

    metrics = MetricsLog(run_dir, info.is_main)
    bleu_refs: list[str] = []
    if t_cfg.valid_bleu and info.is_main:
        bleu_refs = valid_references(cfg, run.valid_set, run.tokenizer,
                                     int(t_cfg.valid_bleu_sentences))
    last_valid: dict[str, float] = {}
    stop_signals = [int(getattr(signal, name)) for name in STOP_SIGNALS if hasattr(signal, name)]
    total_steps = _total_steps(t_cfg, run.steps_per_epoch)
    show_bar = info.is_main and sys.stderr.isatty()
    bar = tqdm(total=total_steps, initial=state.step, disable=not show_bar, unit="step",
               dynamic_ncols=True)
    log_every = max(int(t_cfg.log_every_steps), 1)
    save_every_s = float(t_cfg.save_every_minutes) * 60 if t_cfg.save_every_minutes else None
    max_time_s = float(t_cfg.max_time_minutes) * 60 if t_cfg.max_time_minutes else None
    last_saved_step = last_valid_step = state.step if resumed_from is not None else -1
    last_save_time = time.monotonic()
    window = Window()
    loop_start, cpu_start = time.perf_counter(), time.process_time()
    seconds_before, cpu_before = float(state.train_seconds), float(state.cpu_seconds)
    loader_iter = None
    if info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    log.info("training on %s x %d (%s), update_freq %d, max_tokens %d: step %d of %s",
             device_name(run.device), info.world_size, run.precision, update_freq,
             int(t_cfg.max_tokens), state.step, total_steps)

    stopped_by = reached_limit(t_cfg, state) or _signalled_during_start_up(stop_flag, run, state)
    diverged: TrainingDiverged | None = None
    last_read = time.perf_counter()

    def finish(queued: PendingStep, epoch_at: float) -> list[int]:
        """Read a queued step's figures and account for it (counters, schedule, progress bar,
        train line); returns its flags as every rank summed them."""
        nonlocal window, last_read
        fig = finish_update(run, state, window, queued, t_cfg, run_dir)
        if fig.stepped:
            bar.update(1)
        window.steps += 1
        now = time.perf_counter()
        state.train_seconds = seconds_before + now - loop_start
        state.cpu_seconds = cpu_before + time.process_time() - cpu_start
        bar.set_postfix(loss=f"{fig.loss_sum / max(fig.ntokens, 1):.3f}", lr=f"{fig.lr:.2e}",
                        tok_s=f"{fig.ntokens / max(now - last_read, 1e-9):,.0f}", refresh=False)
        last_read = now
        if state.step % log_every == 0 and window.steps and state.bad_steps_in_row == 0:
            record = window.record(lr=fig.lr, skipped_steps=state.skipped_steps,
                                   tokens_seen=state.tokens_seen, epoch=epoch_at,
                                   device=run.device)
            metrics.write("train", state.step, record)
            if not show_bar:
                log_train_line(state.step, total_steps, record)
            window = Window(grad_norm=window.grad_norm)
        return fig.flags

    # Figures are read one step late (after the next step is queued, before its update: the
    # device never waits); a step that may validate, save or stop is read at once (exact state).
    pending: tuple[PendingStep, float] | None = None
    try:
        while stopped_by is None:
            # -- draw this step's micro-batches (the same count on every rank) --------------
            drawn_from = state.epoch, state.position, state.micro_step
            micro_batches, loader_iter, epoch_ended = _draw(run, state, loader_iter,
                                                            update_freq, seed)
            epoch_at = state.epoch_progress(run.sampler)
            # -- forward / backward over the micro-batches -------------------------------------
            out = None if whole else forward_backward(
                run.train_model, micro_batches, epsilon=epsilon, device=run.device,
                world_size=info.world_size, autocast=run.autocast, scaler=run.scaler,
                pad_to_multiple=run.pad_to_multiple, packed_shape=run.packed_shape)
            # decisions every rank must agree on (time is read on rank 0), summed over the
            # ranks in the step's own all-reduce: no collective or host read of their own
            flags = [*(int(stop_flag.requested == sig) for sig in stop_signals),
                     *_time_requests(info.is_main, save_every_s, time.monotonic() - last_save_time,
                                     max_time_s, seconds_before + time.perf_counter() - loop_start)]
            requested = requests_known_at_once(info.world_size) and any(flags)
            queued = (whole.launch(micro_batches, flags, follows_unread=pending is not None)
                      if whole else None)  # the whole step (trainer.cuda_graphs), queued
            earlier = [0] * len(flags)
            if pending is not None:  # the previous step, read now that this one is queued
                try:
                    earlier = finish(*pending)
                except TrainingDiverged:  # this step takes no update: it was never taken
                    state.epoch, state.position, state.micro_step = drawn_from
                    raise
                pending = None
                requested = requested or any(earlier)

            # -- the update, queued; its figures read now or with the next step ---------------
            queued = queued or queue_update(run, out, t_cfg, flags)
            if not needs_exact_state(t_cfg, state, epoch_ended=epoch_ended, requested=requested):
                pending = queued, epoch_at
                continue
            decided = [max(a, b) for a, b in zip(finish(queued, epoch_at), earlier)]

            # -- the decisions, as every rank read them -----------------------------------------
            *signalled, save_for_time, out_of_time = decided
            stopped_by = _stop_reason(t_cfg, state, stop_signals, signalled, out_of_time)

            # -- validation, checkpoints -----------------------------------------------------------
            best = False
            if should_validate(t_cfg, state, epoch_ended=epoch_ended, stopped_by=stopped_by,
                               last_valid_step=last_valid_step):
                last_valid, best = run_validation(
                    cfg, run.model, run.valid_loader, run.valid_set, run.tokenizer, state,
                    device=run.device, autocast=run.autocast, is_main=info.is_main,
                    references=bleu_refs, max_batches=valid_max_batches)
                metrics.write("valid", state.step, last_valid)
                last_valid_step = state.step
                if (t_cfg.patience is not None and stopped_by is None
                        and state.validations_without_improvement >= int(t_cfg.patience)):
                    stopped_by = "patience"
            regular = should_save(t_cfg, state, epoch_ended=epoch_ended, stopped_by=stopped_by,
                                  last_saved_step=last_saved_step, save_for_time=save_for_time)
            if (regular or best) and not t_cfg.no_save:
                resume.save_training(run_dir, run, state, info, config=cfg, seed=seed,
                                     keep_last=int(t_cfg.keep_last), best=best, regular=regular)
                if regular:
                    last_saved_step, last_save_time = state.step, time.monotonic()
    except TrainingDiverged as e:  # every rank agrees: the losses were all-reduced
        diverged, stopped_by = e, "divergence"
    finally:
        bar.close()
        stop_flag.restore()
        metrics.close()

    state.train_seconds = seconds_before + time.perf_counter() - loop_start
    state.cpu_seconds = cpu_before + time.process_time() - cpu_start
    summary = write_summary(cfg, run, state, info, stopped_by, last_valid, resumed_from,
                            last_finite_checkpoint=diverged and diverged.last_finite_checkpoint)
    if diverged is not None:
        raise diverged
    # submitit's SIGUSR2 handler (requeue the job, exit) runs once the stop checkpoint is written
    stop_flag.hand_over()
    return summary


def _total_steps(t_cfg: Any, steps_per_epoch: int) -> int | None:
    """The run's optimizer steps: ``max_steps``, else ``max_epochs`` epochs, else None."""
    if t_cfg.max_steps is not None:
        return int(t_cfg.max_steps)
    return int(t_cfg.max_epochs) * steps_per_epoch if t_cfg.max_epochs is not None else None


def _time_requests(is_main: bool, save_every_s: float | None, since_save_s: float,
                   max_time_s: float | None, elapsed_s: float) -> list[int]:
    """``[save for time, out of time]`` as 0/1 flags (decided on rank 0 only: every rank
    sums them in the step's all-reduce)."""
    return [int(is_main and save_every_s is not None and since_save_s >= save_every_s),
            int(is_main and max_time_s is not None and elapsed_s >= max_time_s)]


def _draw(run: Any, state: TrainState, loader_iter: Any, update_freq: int,
          seed: int) -> tuple[list[Any], Any, bool]:
    """The next step's micro-batches (``update_freq``, fewer at the end of an epoch), the
    state's position advanced past them; returns them, the loader iterator to draw from
    next (None after the epoch's last batch) and whether the epoch ended."""
    if loader_iter is None:
        run.sampler.set_epoch(state.epoch)
        run.sampler.load_state_dict(state.sampler_state(seed))
        loader_iter = iter(run.train_loader)
    k = min(update_freq, len(run.sampler) - state.position)
    micro_batches = [next(loader_iter) for _ in range(k)]
    state.position += k
    state.micro_step += k
    epoch_ended = state.position >= len(run.sampler)
    if epoch_ended:
        state.epoch, state.position, loader_iter = state.epoch + 1, 0, None
    return micro_batches, loader_iter, epoch_ended


def _stop_reason(t_cfg: Any, state: TrainState, stop_signals: list[int],
                 signalled: list[int], out_of_time: int) -> str | None:
    """Why the run stops after this step, in order of precedence: a step or epoch limit,
    ``max_time``, then the first stop signal any rank received; None to go on."""
    stopped_by = reached_limit(t_cfg, state)
    if stopped_by is None and out_of_time:
        stopped_by = "max_time"
    signal_num = next((sig for sig, n in zip(stop_signals, signalled) if n), 0)
    if stopped_by is None and signal_num:
        stopped_by = f"signal {signal.Signals(signal_num).name}"
    return stopped_by


def requests_known_at_once(world_size: int) -> bool:
    """Whether this process's own stop and save requests (signals, ``max_time_minutes``,
    ``save_every_minutes``) decide the step they arrive in: with one process they do, and
    the run stops or saves after that step, as it always did; with several ranks they are
    agreed through the step's figures, which are read one step late, so the run stops or
    saves after the next step (every rank at the same one)."""
    return world_size == 1


def _signalled_during_start_up(stop_flag: StopFlag, run: Any, state: Any) -> str | None:
    """``"signal <NAME>"`` when a stop signal reached any rank before the first step (every
    rank calls it: one all-reduce), else None. The run then stops without a step or a new
    checkpoint; its summary says so, and a requeued job resumes where it was."""
    import torch

    received = int(distributed.all_reduce_max(
        torch.tensor([stop_flag.requested], dtype=torch.int64, device=run.device)).item())
    if not received:
        return None
    name = signal.Signals(received).name
    log.info("%s during start-up: stopping before the first step (step %d), no checkpoint "
             "written; started again, the run resumes from where it was", name, state.step)
    return f"signal {name}"
