"""The training loop's counters (:class:`TrainState`, the checkpoint's ``train_state`` and
``sampler`` parts), the limits that end a run (``max_steps``, ``max_epochs``,
``max_time_minutes``, ``patience``) and the loop's decisions after each step
(:func:`should_validate`, :func:`should_save`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from transformer_nmt.config import TrainerConfig
from transformer_nmt.model.flops import TokenCounts


@dataclass
class TrainState:
    """The training loop's counters: what a checkpoint's ``train_state`` and ``sampler`` hold.

    Token counts are non-pad tokens (eos included) over all ranks, skipped steps included.
    """

    step: int = 0  # successful optimizer updates (the learning-rate schedule follows it)
    micro_step: int = 0  # micro-batches consumed per rank
    tokens_seen: int = 0  # target tokens processed
    src_tokens_seen: int = 0  # source tokens processed
    src_sq_seen: int = 0  # sum over sentences of source length^2 (attention FLOPs)
    tgt_sq_seen: int = 0  # sum over sentences of target length^2
    src_tgt_seen: int = 0  # sum over sentences of source length x target length
    epoch: int = 0  # completed passes over the training set
    position: int = 0  # batches per rank consumed in the current epoch
    train_seconds: float = 0.0  # wall-clock seconds in the loop, all resumed segments
    cpu_seconds: float = 0.0  # this process's CPU time in the loop (user + system, every thread)
    skipped_steps: int = 0  # steps skipped for a non-finite loss or gradient norm
    overflow_steps: int = 0  # of which fp16 loss-scaler overflows (finite loss, inf gradient)
    bad_steps_in_row: int = 0  # consecutive skipped steps (stop at trainer.max_bad_steps)
    best_valid_loss: float | None = None
    best_valid_bleu: float | None = None
    validations_without_improvement: int = 0
    world_size: int = 1  # ranks of the run that wrote the state

    DATA_POSITION = ("epoch", "position")

    def state_dict(self) -> dict[str, Any]:
        """Every field except the data position (``epoch``, ``position``: the sampler part)."""
        d = dataclasses.asdict(self)
        return {k: v for k, v in d.items() if k not in self.DATA_POSITION}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s fields; absent ones keep their value.

        Raises:
            ValueError: naming keys that are not fields.
        """
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"train_state has unknown keys {unknown}")
        for k, v in d.items():
            setattr(self, k, v)

    def sampler_state(self, seed: int) -> dict[str, int]:
        """The data position as ``LengthBucketSampler.state_dict()`` writes it."""
        return {"epoch": self.epoch, "position": self.position, "seed": seed}

    def epoch_progress(self, sampler: Any) -> float:
        """Epochs done as a fraction: ``epoch`` plus the part of the current one given after
        ``position`` batches per rank
        (:meth:`~transformer_nmt.data.batching.LengthBucketSampler.epoch_fraction` of the
        training sampler), which counts the sentences an epoch resumed on another world
        size or budget gave before the resume."""
        return self.epoch + sampler.epoch_fraction(self.epoch, self.position)

    def token_counts(self) -> TokenCounts:
        """The processed tokens in the form :func:`transformer_nmt.model.flops.training_flops`
        reads."""
        return TokenCounts(self.src_tokens_seen, self.tokens_seen, self.src_sq_seen,
                           self.tgt_sq_seen, self.src_tgt_seen)


def reached_limit(t_cfg: TrainerConfig, state: TrainState) -> str | None:
    """``"max_steps"`` or ``"max_epochs"`` when ``state`` has reached that limit, else None."""
    if t_cfg.max_steps is not None and state.step >= int(t_cfg.max_steps):
        return "max_steps"
    if t_cfg.max_epochs is not None and state.epoch >= int(t_cfg.max_epochs):
        return "max_epochs"
    return None


def needs_exact_state(t_cfg: TrainerConfig, state: TrainState, *, epoch_ended: bool,
                      requested: bool) -> bool:
    """Whether the loop reads a step's figures before the next step starts instead of one
    step late: when the step, if taken, may be validated, saved or end the run
    (``state.step + 1``, the step it would be, is a multiple of ``validate_every_steps`` or
    ``save_every_steps`` or reaches ``max_steps``; it ends an epoch, so ``save_every_epochs``,
    ``validate_every_epochs`` or ``max_epochs`` may act), or a stop signal, ``max_time_minutes``
    or ``save_every_minutes`` asks for a decision (``requested``). ``state`` holds every
    earlier step, so every rank decides the same."""
    after = state.step + 1
    every = (t_cfg.save_every_steps, t_cfg.validate_every_steps)
    return bool(requested or epoch_ended
                or (t_cfg.max_steps is not None and after >= int(t_cfg.max_steps))
                or any(n and after % int(n) == 0 for n in every))


def should_validate(t_cfg: TrainerConfig, state: TrainState, *, epoch_ended: bool,
                    stopped_by: str | None, last_valid_step: int) -> bool:
    """Whether to validate after this step: the step was taken (not skipped), is not the
    step last validated (``last_valid_step``), and is a multiple of
    ``validate_every_steps``, ends an epoch that is a multiple of ``validate_every_epochs``
    (``epoch_ended``), or ends the run at a limit (``stopped_by`` ``max_steps``,
    ``max_epochs`` or ``max_time``; a signal or ``patience`` does not validate)."""
    if state.bad_steps_in_row or state.step == last_valid_step:
        return False
    vfreq, vepochs = t_cfg.validate_every_steps, t_cfg.validate_every_epochs
    return bool((vfreq and state.step % int(vfreq) == 0)
                or (vepochs and epoch_ended and state.epoch % int(vepochs) == 0)
                or stopped_by in ("max_steps", "max_epochs", "max_time"))


def should_save(t_cfg: TrainerConfig, state: TrainState, *, epoch_ended: bool,
                stopped_by: str | None, last_saved_step: int, save_for_time: bool) -> bool:
    """Whether to write ``checkpoint_<step>.pt`` after this step: not the step last saved
    (``last_saved_step``), and a taken step that is a multiple of ``save_every_steps`` or
    ends an epoch that is a multiple of ``save_every_epochs``, or ``save_every_minutes``
    elapsed (``save_for_time``), or the run stops here (``stopped_by``, whatever the cause)."""
    if state.step == last_saved_step:
        return False
    stepped = state.bad_steps_in_row == 0
    sfreq, sepochs = t_cfg.save_every_steps, t_cfg.save_every_epochs
    return bool((stepped and sfreq and state.step % int(sfreq) == 0)
                or (stepped and sepochs and epoch_ended and state.epoch % int(sepochs) == 0)
                or save_for_time or stopped_by is not None)


def finished_by(t_cfg: TrainerConfig, state: TrainState) -> str | None:
    """Why a resumed run has nothing left to do, or None: ``max_steps`` / ``max_epochs``
    reached, the ``max_time_minutes`` budget spent (``train_seconds`` over all segments), or
    ``patience`` validations without improvement. With a raised limit the run goes on."""
    reached = reached_limit(t_cfg, state)
    if reached is not None:
        return reached
    if t_cfg.max_time_minutes and state.train_seconds >= float(t_cfg.max_time_minutes) * 60:
        return "max_time"
    if t_cfg.patience is not None and state.validations_without_improvement >= int(t_cfg.patience):
        return "patience"
    return None
