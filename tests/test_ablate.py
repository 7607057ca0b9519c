"""pretrain.ablate: every arm trains on the same data and budget, finished arms are skipped,
the results table and curves are written, unequal token budgets are refused."""

import os

import pytest

from data import synthetic
from finetune import demo_task
from pretrain import ablate
from tests import cli_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    base = tmp_path_factory.mktemp("ablate")
    data_dir = synthetic.write_shards(
        str(base / "shards"),
        synthetic.make_documents(40, seed=1, max_len=8),
        synthetic.make_documents(6, seed=2, max_len=8, first_id=150),
    )
    base_gin = base / "base.gin"
    base_gin.write_text("""
include 'configs/recipes/bert.gin'
EncoderConfig.hidden_size = 32
EncoderConfig.num_layers = 1
EncoderConfig.num_heads = 2
EncoderConfig.intermediate_size = 64
PipelineConfig.max_seq_length = 32
PipelineConfig.max_predictions_per_seq = 5
PipelineConfig.document_shuffle_buffer = 10
PipelineConfig.instance_shuffle_buffer = 10
run.batch_size = 8
run.steps = 1000
run.log_every = 2
run.eval_every = 2
run.eval_batches = 1
""")
    grid = base / "grid"
    grid.mkdir()
    (grid / "nsp.gin").write_text("PipelineConfig.sentence_objective = 'nsp'\n")
    (grid / "none.gin").write_text("PipelineConfig.sentence_objective = 'none'\n")
    return data_dir, base_gin, grid


@pytest.fixture
def _ablate(monkeypatch, capsys):
    """`python -m pretrain.ablate GRID ...` in this process (the arms train in their own)."""
    monkeypatch.chdir(ROOT)  # gin includes are relative to the repository root

    def run(grid, workdir, data_dir, base_gin, *extra):
        args = [str(grid), f"--workdir={workdir}", f"--data_dir={data_dir}", f"--gin_file={base_gin}"]
        return cli_run.run(ablate.main, [*args, "--steps=4", *extra], capsys)

    return run


@pytest.mark.slow(60)  # seconds on the 2-core CI machine
@pytest.mark.extended
def test_grid_runs_every_arm_then_skips_them(setup, tmp_path, _ablate):
    data_dir, base_gin, grid = setup
    result = _ablate(grid, tmp_path, data_dir, base_gin)
    assert result.returncode == 0, result.stderr[-3000:]
    table = [[cell.strip() for cell in line.split("|")[1:-1]] for line in (tmp_path / "results.md").open()]
    header = next(cells for cells in table if cells and cells[0] == "arm")
    rows = {cells[0]: dict(zip(header, cells)) for cells in table if cells and cells[0] in ("none", "nsp")}
    assert list(rows) == ["none", "nsp"]
    assert {"loss", "mlm_accuracy", "sentence_accuracy", "tokens/s"} <= set(header)
    assert rows["none"]["sentence_accuracy"] == "-"  # no sentence head, no sentence accuracy
    assert float(rows["nsp"]["sentence_accuracy"]) > 0
    assert float(rows["none"]["mlm_accuracy"]) >= 0 and float(rows["nsp"]["tokens/s"]) > 0
    assert (tmp_path / "eval_curves.png").stat().st_size > 0
    for arm in ("none", "nsp"):
        assert '"step": 4' in (tmp_path / arm / "summary.json").read_text()

    again = _ablate(grid, tmp_path, data_dir, base_gin)
    assert again.returncode == 0
    assert again.stdout.count("finished before, skipped") == 2


def test_unequal_token_budgets_are_refused(setup, tmp_path, _ablate):
    data_dir, base_gin, grid = setup
    uneven = tmp_path / "uneven"
    uneven.mkdir()
    (uneven / "short.gin").write_text("PipelineConfig.max_seq_length = 16\n")
    (uneven / "long.gin").write_text("PipelineConfig.max_seq_length = 32\n")
    result = _ablate(uneven, tmp_path / "w", data_dir, base_gin)
    errors = result.errors()
    assert result.returncode == 2 and len(errors) == 1 and "different numbers of training tokens" in errors[0]


def test_flops_budget_gives_cheaper_arms_more_steps():
    budgets = {
        "electra": {"steps": 100, "flops_per_step": 3.0e9, "tokens": 1},
        "mlm": {"steps": 100, "flops_per_step": 2.0e9, "tokens": 1},
    }
    assert ablate.equalize(budgets, "flops", None) == {"electra": 100, "mlm": 150}
    assert ablate.equalize(budgets, "flops", 10) == {"electra": 10, "mlm": 15}
    assert ablate.equalize(budgets, "tokens", None) == {"electra": 100, "mlm": 100}


@pytest.mark.slow(130)
@pytest.mark.extended
def test_electra_vs_mlm_grid_spends_equal_flops_and_fine_tunes(
    setup, text_shards, tmp_path, _ablate, monkeypatch
):
    _, base_gin, _ = setup
    data_dir = text_shards
    # The arms' processes on one CPU device: 8 fake devices' collectives can stall past
    # XLA's 40 s rendezvous timeout on 2 loaded cores (seen once in fine-tuning).
    monkeypatch.setenv(
        "XLA_FLAGS", "--xla_force_host_platform_device_count=1 --xla_backend_optimization_level=0"
    )
    grid = os.path.join(ROOT, "configs", "ablations", "electra_vs_mlm")
    # A small WordOrder task where the grid looks for it (it makes the full 7000-row one
    # only when none is there).
    demo_task.make_task(str(tmp_path / "glue_data"), train=96, dev=32, test=32)
    glue = tmp_path / "glue.gin"
    glue.write_text(
        "include 'configs/glue/demo.gin'\n"
        "Grid.num_epochs = (1,)\nGrid.seeds = (0,)\nGrid.max_seq_length = 32\n"
    )
    result = _ablate(
        grid,
        tmp_path,
        data_dir,
        base_gin,
        f"--finetune_gin={glue}",
        "--gin_bindings=run.eval_every=100",
        "--steps=8",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    table = [[cell.strip() for cell in line.split("|")[1:-1]] for line in (tmp_path / "results.md").open()]
    header = next(cells for cells in table if cells and cells[0] == "arm")
    arms = ("electra", "mlm", "deberta_v3")
    rows = {cells[0]: dict(zip(header, cells)) for cells in table if cells and cells[0] in arms}
    steps = {arm: int(row["steps"]) for arm, row in rows.items()}
    flops = {arm: float(row["train FLOPs"]) for arm, row in rows.items()}
    per_step = {arm: flops[arm] / steps[arm] for arm in rows}
    costly, *cheaper = sorted(rows, key=per_step.get, reverse=True)
    assert costly == "deberta_v3" and steps[costly] == 8, steps
    for arm in cheaper:
        assert steps[arm] > 8, "a cheaper arm trains more steps"
        assert abs(flops[arm] - flops[costly]) <= per_step[arm] / 2, flops
    assert float(rows["electra"]["paper's count"]) > 0 and float(rows["mlm"]["paper's count"]) > 0
    assert rows["deberta_v3"]["paper's count"] == "-"  # the paper's script has no disentangled attention
    assert rows["mlm"]["disc_accuracy"] == "-"
    for arm in ("electra", "deberta_v3"):
        assert 0 <= float(rows[arm]["disc_accuracy"]) <= 1
    for arm in arms:
        assert 0 <= float(rows[arm]["demo task dev (median)"]) <= 1
        assert (tmp_path / f"{arm}_glue" / "results.json").exists()


def test_attention_dropout_arms_differ_in_attention_dropout_only(monkeypatch):
    """configs/ablations/attention_dropout on the demo run and on BERT-base's recipe: the
    arms' models differ in the attention dropout rate alone, so 'auto' is all that changes
    the attention path (explicit with dropout, or the platform's fused kernel)."""
    import dataclasses

    import gin

    from core import cli
    from models.encoder import EncoderConfig
    from pretrain import trainer  # noqa: F401  (registers what the run files bind)

    monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # gin includes
    for base in (["configs/runs/demo.gin"], ["configs/models/bert_base.gin", "configs/recipes/bert.gin"]):
        arms = {}
        for arm in ("bert", "none"):
            gin.clear_config()
            cli.parse_gin([*base, f"configs/ablations/attention_dropout/{arm}.gin"], [])
            arms[arm] = EncoderConfig()
        gin.clear_config()
        assert (arms["bert"].attention_dropout_rate, arms["none"].attention_dropout_rate) == (0.1, 0.0)
        assert dataclasses.replace(arms["bert"], attention_dropout_rate=0.0) == arms["none"]
        assert arms["bert"].attention_implementation == "auto"


@pytest.mark.slow  # builds three arms' objectives to count their FLOPs
def test_a_grid_names_the_base_run_its_arms_are_written_for(tmp_path):
    """configs/ablations/xlnet's arms (PermutationLM, XLNetMLM) need XLNet's base run: its
    base.txt is the default --gin_file; a grid without one takes the demo run; a base.txt
    naming no file is one line."""
    assert ablate.grid_base(os.path.join(ROOT, "configs", "ablations", "xlnet")) == [
        "configs/runs/demo_xlnet.gin"
    ]
    assert ablate.grid_base(os.path.join(ROOT, "configs", "ablations", "masking")) is None
    (tmp_path / "base.txt").write_text("configs/runs/nothing.gin\n")
    with pytest.raises(ablate.AblationError, match="names 'configs/runs/nothing.gin', which does not exist"):
        ablate.grid_base(str(tmp_path))
    budgets = {
        name: ablate.arm_budget(["configs/runs/demo_xlnet.gin", f"configs/ablations/xlnet/{name}.gin"], [])
        for name in ("plm", "plm_no_memory", "mlm")
    }
    steps = ablate.equalize(budgets, "flops", 800)
    assert steps["plm"] == 800 and steps["plm"] < steps["plm_no_memory"] < steps["mlm"]
