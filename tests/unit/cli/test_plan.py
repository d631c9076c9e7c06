"""``zerospec plan`` through the real entry point: every mode and format, units, and bad input."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.cli import assert_usage_error, run_cli


def test_plan_gib_on_request(capsys):
    """`--units GiB`: 120e9 bytes print as 112 GiB (2^30 bytes), not 120."""
    rc, out, _ = run_cli(capsys, "plan", "--units", "GiB", "--stage", "0")
    assert rc == 0 and "| 112 GiB |" in out and "120 GB" not in out


def test_plan_estimators_side_by_side(capsys):
    """The estimator table names DeepSpeed's 2Ψ+18Ψ/N and Megatron's 4Ψ+16Ψ/N next to the paper's."""
    rc, out, _ = run_cli(capsys, "plan", "--largest-layer", "1e8")
    assert rc == 0
    assert "| ZeRO-2 (P_os+g) | 2Ψ+14Ψ/N | 2Ψ+18Ψ/N | n/a |" in out
    assert "| ZeRO-1 (P_os) | 4Ψ+12Ψ/N | n/a | 4Ψ+16Ψ/N |" in out
    assert "L (largest layer) = 100,000,000" in out


def test_largest_layer_zero_is_the_default_it_says(capsys):
    """`--largest-layer 0` is accepted and prints exactly what no --largest-layer prints ("default 0")."""
    default = run_cli(capsys, "plan")
    assert run_cli(capsys, "plan", "--largest-layer", "0") == default
    assert default[0] == 0 and "L (largest layer) = 0 parameters" in default[1]


@pytest.mark.parametrize("zero,params,traffic", [
    ({"stage": 1}, "7.5B", "3Ψ(N−1)/N = 2.625Ψ"),                       # multi-rank all-reduce
    ({"stage": 2, "use_multi_rank_bucket_allreduce": False}, "7.5B", "2Ψ(N−1)/N = 1.75Ψ"),
    ({"stage": 3}, "175M", "2Ψ(N−1)/N = 1.75Ψ"),                         # R = 1e9 >= 2Ψ: all kept
    ({"stage": 3}, "7.5B", "between 2Ψ and 3Ψ"),                         # R < 2Ψ: depends on sizes
    ({"stage": 3, "stage3_max_reuse_distance": 0}, "7.5B", "between 2Ψ and 3Ψ"),  # small ones whole
    ({"stage": 3, "stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 0},
     "7.5B", "3Ψ(N−1)/N = 2.625Ψ"),
], ids=["zero1-default", "zero2-paper", "zero3-default-small", "zero3-default-large",
        "zero3-no-reuse", "zero3-paper"])
def test_plan_reads_a_deepspeed_config_and_names_its_traffic(capsys, tmp_path, zero, params, traffic):
    """`plan --deepspeed-config`: the closed-form traffic per step its settings imply (N = 8), and
    its stage's memory per estimator; spec/deepspeed.md measures each case on a real DeepSpeed."""
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero}))
    rc, out, _ = run_cli(capsys, "plan", "--deepspeed-config", str(cfg), "--params", params,
                         "--gpus", "8", "--format", "json")
    assert rc == 0
    tables = {t["name"]: t for t in json.loads(out)["tables"]}
    rows = {r[0]: r for r in tables["deepspeed_config"]["rows"]}
    assert rows["traffic per step (closed form)"][2].startswith(traffic)
    assert rows["stage"][1] == str(zero["stage"])
    assert [r[0][:6] for r in tables["estimators"]["rows"]] == [f"ZeRO-{zero['stage']}"]   # its stage only


@pytest.mark.parametrize("text,named", [
    ('{"zero_optimization": {"stage": 5}}', "zero_optimization.stage = 5; accepted: 0, 1, 2 or 3"),
    ('{"zero_optimization": {"stage": 3, "stage3_max_reuse_distance": -1}}',
     "stage3_max_reuse_distance = -1; accepted: an integer >= 0"),
    ("stage: 3", "cannot read DeepSpeed config"),
    ('[{"zero_optimization": {"stage": 3}}]', "a DeepSpeed config is a JSON object, got a list"),
])
def test_a_bad_deepspeed_config_is_a_usage_error_naming_the_value(capsys, tmp_path, text, named):
    """A config that DeepSpeed would refuse: exit code 2, one line naming the setting and its value."""
    cfg = tmp_path / "ds.json"
    cfg.write_text(text)
    assert_usage_error(capsys, "plan", "--deepspeed-config", str(cfg), named=named)


@pytest.mark.parametrize("argv,named", [
    (["plan", "--params", "-5"], "'-5'"),
    (["plan", "--largest-layer", "-3"], "largest layer must be a parameter count >= 0"),
    (["plan", "--params", "0"], "'0'"),
    (["plan", "--gpus", "0"], "'0'"),
    (["plan", "--gpus", "two"], "'two'"),
    (["plan", "--table2", "--mp", "0"], "model-parallel degree N_m must be >= 1, got '0'"),
    (["plan", "--gpu-mem", "32"], "'32'"),
    (["plan", "--gpu-mem", "-1GB"], "'-1GB'"),
    (["plan", "--bandwidth", "0GB/s"], "'0GB/s'"),
    (["plan", "--bandwidth", "fast"], "'fast'"),
    (["plan", "--stage", "4"], "'4'"),
    (["plan", "--estimator", "guess"], "'guess'"),
])
def test_bad_plan_input_is_one_line_and_exit_code_2(capsys, argv, named):
    """Bad input: exit code 2, one line on stderr naming the value, nothing on stdout."""
    assert_usage_error(capsys, *argv, named=named)


# what a process answers before it needs torch: `plan` (closed forms), the subcommands' list, every
# subcommand's help and a wrong option of the commands that train, measure or reproduce
WITHOUT_TORCH = [["plan", "--params", "7.5B", "--gpus", "64"], [], ["report", "--ranks", "0"],
                 ["report", "--stages", "0,7"], ["train", "--precision", "fp8"],
                 ["train", "--zero1-comm", "all"], ["paper", "--figure", "5"],
                 *([c, "--help"] for c in ("plan", "report", "scale", "train", "paper", "demo"))]


def test_a_mode_named_is_the_mode_its_flag_selects(capsys):
    """`zerospec plan tables …` prints what `zerospec plan …` prints: the tables mode is the
    default, named or not; its parser alone takes --table1 (another mode's option is refused by
    the mode's parser, naming the mode that takes it)."""
    assert run_cli(capsys, "plan", "tables", "--table1") == run_cli(capsys, "plan", "--table1")
    assert_usage_error(capsys, "plan", "explain", "--table1",
                       named="`zerospec plan --explain` does not take --table1, an option of "
                             "`zerospec plan` without a mode flag: drop --explain")


def test_plan_help_and_refusals_answer_without_importing_torch():
    """`zerospec plan`, `zerospec` with no command, each subcommand's --help and a wrong option of
    `report`, `train` or `paper` answer in one process without importing torch (tenths of a second,
    where torch's import alone takes seconds)."""
    code = ("import sys; from zerospec.__main__ import main\n"
            "def rc(argv):\n"
            "    try:\n        return main(argv)\n"
            "    except SystemExit as exc:\n        return exc.code\n"
            f"rcs = [rc(a) for a in {WITHOUT_TORCH!r}]\n"
            "print(*rcs, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.splitlines()[-1] == "0 2 2 2 2 2 2 0 0 0 0 0 0 False", done.stderr
    assert "plan      per-GPU model states" in done.stderr     # the help, with each subcommand's line
    for named in ("'0'", "'7'", "'fp8'", "'all'", "'5'"):        # each refusal names its value
        assert named in done.stderr


def test_the_package_imports_nothing_heavy_until_asked():
    """``import zerospec`` alone loads no torch, yet the dotted paths the README shows
    (``zerospec.training.checkpoint.load``) resolve from it: subpackages load on first use."""
    # A fresh process in which torch cannot be imported (collection has imported everything in
    # this one): the package imports, and the dotted path fails on torch's import, so reaching it
    # is what imports; the 2 s of importing torch there would add nothing the lines below do not.
    code = ("import sys\n"
            "class NoTorch:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] == 'torch':\n"
            "            raise ModuleNotFoundError('no torch here', name=name)\n"
            "sys.meta_path.insert(0, NoTorch())\n"
            "import zerospec\n"
            "try:\n    zerospec.training.checkpoint.load\n"
            "except ModuleNotFoundError as exc:\n    print(exc.name)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.splitlines() == ["torch"], done.stdout + done.stderr
    # where torch imports, the same lookup gives the modules' own functions
    import zerospec
    from zerospec.cluster.processes import launch
    from zerospec.training.checkpoint import load
    assert zerospec.__getattr__("training").checkpoint.load is load
    assert zerospec.__getattr__("cluster").processes.launch is launch


def test_the_lazy_package_gives_every_public_name():
    """Every name of ``zerospec.__all__`` resolves through the lazy package, and a wrong name is
    refused. (In this process: torch is loaded here anyway.)"""
    import zerospec
    assert len([getattr(zerospec, n) for n in zerospec.__all__]) == 16
    assert sorted(zerospec._HOME) == sorted(zerospec.__all__)
    assert not hasattr(zerospec, "nonesuch")


def test_console_entry_point_fails_cleanly_as_a_process():
    """`python -m zerospec plan --gpu-mem lots` as a process: exit 2, the value named, no traceback."""
    bad = subprocess.run([sys.executable, "-m", "zerospec", "plan", "--gpu-mem", "lots"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "'lots'" in bad.stderr
    assert bad.stdout == ""


EXPLAIN = ("plan", "--preset", "llama-3-8b", "--gpus", "8", "--stage", "1", "--seq", "1024",
           "--explain")


def test_explain_fits_on_dgx_a100_80gb_but_not_on_40gb(capsys, monkeypatch):
    """`plan --explain`: Llama-3-8B at ZeRO-1 on 8 GPUs (4Ψ + 12Ψ/8 ≈ 44 GB of model states) fits
    an 80 GB A100 and not a 40 GB one, the highest phase marked."""
    rc, out, _ = run_cli(capsys, *EXPLAIN, "--machine", "dgx-a100-80gb")
    assert rc == 0 and "fits, with" in out and "(highest)" in out
    # the verdict only: what would make it fit (a meta step per change) is test_suggest.py's
    monkeypatch.setattr("zerospec.plan.suggest.suggestions", lambda ex, config_given=False: [])
    rc, out, _ = run_cli(capsys, *EXPLAIN, "--machine", "dgx-a100-40gb")
    assert rc == 0 and "does NOT fit: over by" in out


def test_explain_json_has_the_three_tables(capsys):
    """`--format json`: the phases, the buffers and the estimates, with raw bytes."""
    # on a GPU it fits: a step that does not fit adds the suggestions' meta steps, which are
    # tests/unit/plan/test_suggest.py's (its JSON summary included)
    rc, out, _ = run_cli(capsys, *EXPLAIN, "--machine", "dgx-a100-80gb", "--format", "json")
    assert rc == 0
    for name in ("explain_phases", "explain_buffers", "explain_estimates"):
        assert name in out


@pytest.mark.parametrize("argv,named", [
    (("plan", "--explain", "--gpus", "8", "--stage", "3"), "--explain needs one model: --preset NAME"),
    (("plan", "--explain", "--preset", "llama-3-8b", "--gpus", "8"), "--explain needs --stage"),
    (("plan", "--explain", "--preset", "llama-3-8b", "--stage", "1,3"), "give one --stage"),
    (("plan", "--explain", "--preset", "llama-3-8b", "--stage", "3", "--seq", "9000"),
     "--seq 9000 is outside 1..8192, llama-3-8b's context"),
    (("plan", "--seq", "1024"), "add --explain"),
    (("plan", "--explain", "--preset", "llama-3-8b", "--stage", "3", "--table1"),
     "does not take --table1"),
    (("plan", "--explain", "--preset", "llama-4", "--stage", "3"),
     "invalid choice: 'llama-4' (choose from '1.5B', '7.5B', '128B', '1T', 't4-1.5B-48x1600'"),
    (("plan", "--explain", "--preset", "llama-3-8b", "--stage", "3", "--gpus", "24", "--mp", "3"),
     "n_m=3 must divide n_head=32"),
    (("plan", "--explain", "--preset", "llama-3-8b", "--stage", "3", "--gpus", "12", "--mp", "8"),
     "--gpus 12 must be a multiple of --mp 8"),
    (("plan", "--explain", "--preset", "llama-3-8b", "--stage", "3", "--preset", "1.5B",
      "--hf-config", "nowhere.json"), "cannot read Hugging Face config 'nowhere.json'"),
    (("plan", "--out", "x"), "add --explain"),
], ids=["no-preset", "no-stage", "two-stages", "seq-past-context", "seq-without-explain",
        "with-table1", "unknown-preset", "mp-not-dividing-heads", "gpus-not-multiple-of-mp",
        "hf-config-unreadable", "out-without-explain"])
def test_explain_bad_input_is_one_line_exit_2(capsys, argv, named):
    """Bad --explain input: exit 2, one line naming what is wrong."""
    assert_usage_error(capsys, *argv, named=named)
