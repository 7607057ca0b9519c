"""A pretraining workdir's launch history, and which settings a resume may change.

Every launch that gets past its checks appends one record, `WORKDIR/launches/NNNN.json`:

    {"launch": n, "launch_id", "started" (UTC), "host", "pid", "argv", "resumed_from",
     "data_fingerprint", "changes": [{"setting", "was", "now"}], "settings" (settings_view),
     "config" (gin.config_str()), "operative_config" (gin.operative_config_str())}

so the settings that trained each checkpoint stay on record, whatever a later launch
binds. (`config.gin` and `operative_config.gin` beside them are the latest launch's.)

A launch that resumes (the workdir has a checkpoint) is compared with the last record,
setting by setting (`changes`), and each change is one of three kinds (`kind`):

- **free**: how long and how often (`run.steps`, the cadences, `run.microbatches`, ...),
  the learning-rate schedule (core/optim.py `SCHEDULE_PARAMETERS`) and how the model is
  computed (models/encoder.py `COMPUTE_FIELDS`: dtype, attention path, remat). The resume
  goes on, one log line per change, and the record keeps it.
- **data stream**: the global batch (`run.batch_size`), the input pipeline
  (`PipelineConfig.*`: sequence length, masking, format, ...) and the shards (`run.data_dir`
  whose manifest fingerprint differs; the same shards at another path are free). Refused in
  one line, unless the launch binds `run.reset_data_iterator = True`: then the model and
  optimizer state go on and the data stream restarts from its beginning with the new
  setting (logged and recorded).
- **fixed**, everything else (the model's shape, the objective, the optimizer and its
  other hyperparameters, ...): refused in one line that names the setting, its recorded
  value, and the way out (the recorded value, or a new workdir with `run.init_from`).

A workdir from before launch records starts its history with its next launch, uncompared.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import sys
import time
from typing import Any

import gin
import tensorflow as tf

from core.errors import ConfigError
from core.optim import SCHEDULE_PARAMETERS
from models.encoder import COMPUTE_FIELDS

log = logging.getLogger(__name__)

LAUNCHES_DIR = "launches"

# run.* settings (pretrain/trainer.py RunSettings) that do not change what the checkpoints
# mean: the length of the run, cadences, how the step is split, what to do on trouble.
_FREE_RUN_SETTINGS = frozenset(
    {
        "steps",
        "log_every",
        "eval_every",
        "eval_batches",
        "eval_at_start",
        "checkpoint_every",
        "max_checkpoints",
        "max_skipped_steps",
        "checkpoint_carry",
        "microbatches",
        "reset_data_iterator",
        "init_from",  # read only when a workdir has no checkpoint
        "seed",  # the initial parameters are in the checkpoint; only the dropout stream moves on
        "dropout_prng",
    }
)
_FREE = {
    "run": _FREE_RUN_SETTINGS,
    "EncoderConfig": COMPUTE_FIELDS,
    "adamw": SCHEDULE_PARAMETERS,
    "lamb": SCHEDULE_PARAMETERS,
    # XLNet's memory length: a checkpoint's memories of another length restart from their
    # initial value (core/checkpointing.py), the model and optimizer state go on.
    "XLNetOptions": frozenset({"mem_len"}),
    # How parameters are laid out on the mesh, which a run may change as it may its mesh.
    "logical_axis_rules": frozenset({"fsdp_embed"}),
}
_STREAM_RUN_SETTINGS = frozenset({"batch_size", "data_dir", "pipeline_config", "phase2_pipeline_config"})
_UNBOUND = "(default)"
# The change of shards written anew at the same path (their manifest's fingerprint).
_SHARDS = "the fingerprint of the shards in run.data_dir"


@dataclasses.dataclass(frozen=True)
class Change:
    """One setting this launch gives another value than the previous launch did."""

    setting: str
    was: str
    now: str
    kind: str  # "free", "stream" or "fixed"


def settings_view(settings: Any, objective: Any) -> dict[str, str]:
    """{binding name: value text} of a run's settings (a RunSettings): `run.*`, the model's
    `EncoderConfig.*` (its option dataclasses as `XLNetOptions.*`, `DisentangledConfig.*`),
    the pipeline's `PipelineConfig.*` (phase 2's as `phase2/PipelineConfig.*`) and the
    objective trained, `make_objective.objective`. Read from the objects, so a run configured
    in Python (the tests, the demo) is described as well as one configured by gin files."""
    view: dict[str, str] = {}
    names = {"model_config": "EncoderConfig", "pipeline_config": "PipelineConfig"}
    names["phase2_pipeline_config"] = "phase2/PipelineConfig"
    for field in dataclasses.fields(settings):
        value = getattr(settings, field.name)
        if field.name in names and value is not None:
            view[f"run.{field.name}"] = type(value).__name__
            _flatten(names[field.name], value, view)
        elif field.name == "optimizer_fn":
            view["run.optimizer_fn"] = getattr(value, "__name__", type(value).__name__)
        else:
            view[f"run.{field.name}"] = repr(value)
    view["make_objective.objective"] = type(objective).__name__
    return view


def _flatten(prefix: str, config: Any, view: dict[str, str]) -> None:
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value):
            view[f"{prefix}.{field.name}"] = type(value).__name__
            _flatten(type(value).__name__, value, view)
        else:
            view[f"{prefix}.{field.name}"] = repr(value)


def bindings(config: str) -> dict[str, str]:
    """{`scope/Configurable.parameter`: value text} of a gin config as gin writes it (one
    binding per line, a value's continuation lines indented; comments skipped)."""
    out: dict[str, str] = {}
    key = None
    for line in config.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line[0].isspace() and key is not None:
            out[key] += " " + line.strip()
        elif " = " in line:
            key, value = line.split(" = ", 1)
            key = key.strip()
            out[key] = value.strip()
    return out


def kind(setting: str) -> str:
    """'free', 'stream' or 'fixed' (see the module docstring) of a binding's name."""
    name = setting.rsplit("/", 1)[-1]
    configurable, _, parameter = name.rpartition(".")
    configurable = configurable.rsplit(".", 1)[-1]  # a module-qualified name
    if parameter in _FREE.get(configurable, ()):
        return "free"
    if configurable == "PipelineConfig" or (configurable == "run" and parameter in _STREAM_RUN_SETTINGS):
        return "stream"
    return "fixed"


def _configurable(setting: str) -> str:
    return setting.rsplit("/", 1)[-1].rpartition(".")[0].rsplit(".", 1)[-1]


def _records(workdir: str) -> list[str]:
    directory = os.path.join(workdir, LAUNCHES_DIR)
    if not tf.io.gfile.isdir(directory):
        return []
    return sorted(
        os.path.join(directory, name) for name in tf.io.gfile.listdir(directory) if name.endswith(".json")
    )


def previous(workdir: str, latest_step: int) -> dict | None:
    """The record of the launch that wrote checkpoint `latest_step` (with its path as
    "where"): the last one that started before that step. A later launch that resumed from
    it and saved nothing (it failed, or had nothing left to train) changed no checkpoint,
    so its settings are not what the checkpoint means. None when no record says."""
    for path in reversed(_records(workdir)):
        with tf.io.gfile.GFile(path) as f:
            record = json.load(f)
        if (record.get("resumed_from") or 0) < latest_step:
            record["where"] = path
            return record
    return None


def changes(before: dict, view: dict[str, str], data_fingerprint: str | None) -> list[Change]:
    """The settings this launch (its `settings_view`, gin config and the shards' fingerprint)
    gives other values than the record `before`. A setting only one of the two knows (code
    of another version) is not compared; the gin bindings of other configurables (the
    objective's, the optimizer's) are, over every binding either launch made, at its
    operative value when the other launch left it unbound."""
    found = []
    fingerprints = (before.get("data_fingerprint"), data_fingerprint)
    same_shards = None not in fingerprints and fingerprints[0] == fingerprints[1]
    for setting in sorted(set(before["settings"]) & set(view)):
        was, now = before["settings"][setting], view[setting]
        if was != now:
            moved = setting == "run.data_dir" and same_shards  # the same shards at another path
            found.append(Change(setting, was, now, "free" if moved else kind(setting)))
    if (
        None not in fingerprints
        and not same_shards
        and view.get("run.data_dir") == before["settings"].get("run.data_dir")
    ):  # shards written anew in place (data.preprocess --overwrite)
        found.append(Change(_SHARDS, fingerprints[0], fingerprints[1], "stream"))
    described = {_configurable(setting) for setting in view}
    explicit = (bindings(before["config"]), bindings(gin.config_str()))
    operative = (bindings(before["operative_config"]), bindings(gin.operative_config_str()))
    for setting in sorted(set(explicit[0]) | set(explicit[1])):
        # Macros (`STEPS = 100`) act through the bindings that use them, compared as those.
        if "." not in setting or _configurable(setting) in described:
            continue
        was, now = (explicit[i].get(setting, operative[i].get(setting, _UNBOUND)) for i in range(2))
        if was != now:
            found.append(Change(setting, was, now, kind(setting)))
    return found


def check(changed: list[Change], workdir: str, before: dict, reset_data_iterator: bool) -> bool:
    """Raises ConfigError (one line) for a change a resume may not make; logs the others.
    Returns whether the data stream restarts (a stream change with reset_data_iterator)."""
    where = before["where"]
    fixed = [c for c in changed if c.kind == "fixed"]
    stream = [c for c in changed if c.kind == "stream"]
    more = lambda cs: f" (and {', '.join(c.setting for c in cs[1:])})" if len(cs) > 1 else ""
    if fixed:
        c = fixed[0]
        raise ConfigError(
            f"{c.setting} = {c.now}{more(fixed)}, but the checkpoints in {workdir} were trained with "
            f"{c.was} ({where}): resume with {c.setting} = {c.was}, or start a new --workdir "
            f"(run.init_from = '{workdir}' begins it from these parameters)"
        )
    if stream and not reset_data_iterator:
        c = stream[0]
        reset = (
            "bind run.reset_data_iterator = True to go on from these checkpoints with the new setting "
            "and the data stream restarted from its beginning"
        )
        if c.setting == _SHARDS:
            raise ConfigError(
                f"the shards in run.data_dir were written anew since the checkpoints in {workdir} were "
                f"trained (fingerprint {c.now[:12]}, theirs {c.was[:12]}: {where}): resume with the shards "
                f"they were trained on, or {reset}"
            )
        raise ConfigError(
            f"{c.setting} = {c.now}{more(stream)}, but the checkpoints in {workdir} were trained with "
            f"{c.was} ({where}): resume with {c.setting} = {c.was}, or {reset}"
        )
    for c in changed:
        log.info("this launch changes %s: %s -> %s (the checkpoints go on)", c.setting, c.was, c.now)
    if stream:
        log.warning(
            "the data stream restarts from its beginning (run.reset_data_iterator, and %s changed)",
            ", ".join(c.setting for c in stream),
        )
    return bool(stream)


def append(
    workdir: str,
    *,
    launch_id: str | None,
    resumed_from: int | None,
    data_fingerprint: str | None,
    changed: list[Change],
    view: dict[str, str],
) -> str:
    """Writes this launch's record (process 0 only); returns its path."""
    number = len(_records(workdir)) + 1
    path = os.path.join(workdir, LAUNCHES_DIR, f"{number:04d}.json")
    record = {
        "launch": number,
        "launch_id": launch_id,
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "argv": sys.argv,
        "resumed_from": resumed_from,
        "data_fingerprint": data_fingerprint,
        "changes": [{"setting": c.setting, "was": c.was, "now": c.now} for c in changed],
        "settings": view,
        "config": gin.config_str(),
        "operative_config": gin.operative_config_str(),
    }
    tf.io.gfile.makedirs(os.path.dirname(path))
    with tf.io.gfile.GFile(path, "w") as f:
        json.dump(record, f, indent=1)
    return path
