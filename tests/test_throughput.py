"""The trainer's logged rates agree with the wall clock on a run whose device step is slow on
purpose: each step sleeps inside the compiled computation (a debug callback), so the host
dispatches long before the device finishes. Windows timed at dispatch would report several
times the real rate; ours are timed from completed step to completed step."""

import json
import time

import jax
import pytest

from core import metrics_log, throughput
from pretrain import trainer
from pretrain.objectives import MaskedLM
from tests import tiny

# Seconds per train step, spent on the "device": long enough that the host's jitter on a
# busy 2-core machine (the other test worker) stays well under 10% of a 10-step window.
SLEEP = 0.3
STEPS, LOG_EVERY = 40, 10


class SlowMaskedLM(MaskedLM):
    """MaskedLM whose training loss sleeps SLEEP seconds when the device runs it."""

    def loss(self, params, batch, rngs, normalizers, *, train):
        if train:
            jax.debug.callback(lambda: time.sleep(SLEEP))
        return super().loss(params, batch, rngs, normalizers, train=train)


@pytest.mark.slow(30)
@pytest.mark.extended
def test_logged_rates_eta_and_summary_follow_the_wall_clock(tmp_path, monkeypatch, synthetic_shards):
    logged = []  # (wall clock, step, values) of every train log line, when it is written
    write = metrics_log.MetricsWriter.write

    def timed_write(self, step, split, values):
        if split == "train":
            logged.append((time.perf_counter(), step, dict(values)))
        return write(self, step, split, values)

    monkeypatch.setattr(metrics_log.MetricsWriter, "write", timed_write)
    monkeypatch.setattr(trainer, "make_objective", lambda config, data: SlowMaskedLM(config, data))
    started = time.perf_counter()
    summary = tiny.run(
        tmp_path / "run",
        synthetic_shards,
        STEPS,
        batch_size=8,
        log_every=LOG_EVERY,
        eval_batches=1,
        checkpoint_every=1000,
    )
    wall = time.perf_counter() - started
    assert [step for _, step, _ in logged] == [10, 20, 30, 40]
    for (t0, s0, _), (t1, s1, values) in zip(logged, logged[1:]):
        measured = (s1 - s0) / (t1 - t0)
        assert values["steps_per_second"] == pytest.approx(measured, rel=0.1), (s1, measured)
        assert values["steps_per_second"] < 1 / SLEEP  # a step can never beat its sleep
        tokens_per_step = values["tokens_per_second"] / values["steps_per_second"]
        assert 8 <= tokens_per_step <= 8 * tiny.DATA.max_seq_length
    # The ETA at step 20 is the time the last 20 steps then took.
    t20, _, at20 = logged[1]
    assert at20["eta_seconds"] == pytest.approx(logged[-1][0] - t20, rel=0.1)
    # summary.json: tokens / training time, which covers at least every step's sleep.
    assert STEPS * SLEEP <= summary["train_seconds"] <= wall
    steady = logged[-1][2]["tokens_per_second"]
    assert summary["tokens_per_second"] <= 1.1 * steady
    on_disk = json.load(open(tmp_path / "run" / "summary.json"))
    assert on_disk["tokens_per_second"] == summary["tokens_per_second"]


@pytest.mark.slow(20)
@pytest.mark.extended
def test_finetuning_rates_follow_the_wall_clock(monkeypatch):
    from finetune import trainer as finetune_trainer
    from finetune.tasks import TASKS
    from tests import finetune_setup

    done = []  # wall clock when each training step's sleep ends, on the "device"

    def slow_step():
        time.sleep(SLEEP)
        done.append(time.perf_counter())

    loss = finetune_trainer._loss

    def slow_loss(logits, batch, regression):
        jax.debug.callback(slow_step)
        return loss(logits, batch, regression)

    monkeypatch.setattr(finetune_trainer, "_loss", slow_loss)
    tokenizer, config, params = finetune_setup.tiny_model()
    task = TASKS["rte"]
    train = finetune_trainer.featurize(finetune_setup.pair_examples(80, 0), task, tokenizer, 16)
    dev = finetune_trainer.featurize(finetune_setup.pair_examples(16, 1), task, tokenizer, 16)
    result = finetune_trainer.finetune(
        finetune_setup.task_steps(config, task),
        params,
        train,
        {"dev": dev},
        {},
        finetune_trainer.RunConfig(learning_rate=1e-3, batch_size=8, num_epochs=2, seed=0),
    )
    assert len(done) == 20  # 10 steps per epoch
    # The real rate of each epoch from its steps' completion times. Epoch 1's window opens
    # when its first step (the compilation) has finished; both close when their last step
    # has; the dev evaluation after epoch 1 (between steps 10 and 11) is left out.
    real = [9 / (done[9] - done[0]), 9 / (done[19] - done[10])]
    for epoch, measured in zip(result.epochs, real, strict=True):
        assert epoch["steps_per_second"] == pytest.approx(measured, rel=0.1), (epoch, measured)
        assert epoch["steps_per_second"] < 1 / SLEEP
        assert epoch["tokens_per_second"] / epoch["steps_per_second"] == pytest.approx(
            train.input_mask.sum() / 10, rel=0.3
        )


@pytest.mark.parametrize(
    "seconds, shown",
    [
        (0, "00:00:00"),
        (59.6, "00:01:00"),
        (3 * 3600 + 25 * 60 + 7, "03:25:07"),
        (86399, "23:59:59"),
        (3 * 86400 + 3600, "3d 01:00:00"),
        (86400, "1d 00:00:00"),
        (-5, "00:00:00"),
    ],
)
def test_the_eta_shows_days(seconds, shown):
    """A 3-day pod run's ETA: `%H:%M:%S` of the seconds would wrap to 01:00:00."""
    assert throughput.format_duration(seconds) == shown
