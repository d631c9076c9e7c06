"""`--machine` on `zerospec plan` and `zerospec scale`: a machine sets the plan's GPU memory and link
(explicit --gpu-mem/--bandwidth win) and marks which measured stages fit its GPU; bad names refused."""
from __future__ import annotations

import json

import pytest

from tests.support.cli import assert_usage_error, run_cli

NAMES = "dgx2, h200, dgx-a100-40gb, dgx-a100-80gb, dgx-h100"


def plan_json(capsys, *argv) -> list[dict]:
    rc, out, err = run_cli(capsys, "plan", "--format", "json", *argv)
    assert rc == 0, err
    return json.loads(out)["tables"]


def without_notes(tables: list[dict]) -> list[dict]:
    return [{k: v for k, v in t.items() if k != "notes"} for t in tables]


@pytest.mark.parametrize("machine,gpus,mem,link", [
    ("dgx-h100", 64, "80GB", "400Gbps"),          # the ring leaves the node: one 400 Gb/s NIC
    ("dgx-h100", 8, "80GB", "450GB/s"),           # inside the node: NVLink's 900 GB/s over 2
    ("dgx-a100-40gb", 16, "40GB", "200Gbps"),
    ("dgx2", 16, "32GB", "150GB/s"),              # the paper's node holds 16 GPUs
])
def test_plan_on_a_machine_is_the_plan_of_its_memory_and_link(capsys, machine, gpus, mem, link):
    """`plan --machine M` prints the tables of `--gpu-mem <its GPU> --bandwidth <its link>`, plus one
    note naming the machine and where each value came from."""
    common = ("--gpus", str(gpus), "--params", "7.5B,1T")
    by_machine = plan_json(capsys, "--machine", machine, *common)
    by_hand = plan_json(capsys, "--gpu-mem", mem, "--bandwidth", link, *common)
    assert without_notes(by_machine) == without_notes(by_hand)
    for m, h in zip(by_machine, by_hand):    # the plan table gains the machine's note, no other
        assert m["notes"][:len(h["notes"])] == h["notes"]
        assert len(m["notes"]) - len(h["notes"]) == (m["name"] == "plan")
    note = by_machine[0]["notes"][-1]
    assert note.startswith(f"Machine {machine},") and "(its datasheet)" in note


def test_an_explicit_gpu_mem_and_bandwidth_win_over_the_machine(capsys):
    """`--machine dgx-a100-40gb --gpu-mem 80GB --bandwidth 50GB/s` plans with 80 GB and 50 GB/s, and
    its note says both came from the flags and what the machine's were."""
    argv = ("--gpu-mem", "80GB", "--bandwidth", "50GB/s", "--gpus", "64")
    by_flags = plan_json(capsys, "--machine", "dgx-a100-40gb", *argv)
    assert without_notes(by_flags) == without_notes(plan_json(capsys, *argv))
    note = by_flags[0]["notes"][-1]
    assert "80 GB per GPU from --gpu-mem (the machine's: 40 GB)" in note
    assert "50 GB/s from --bandwidth (the machine's: 25 GB/s)" in note


@pytest.mark.parametrize("machine,at", [("dgx-h100", 320 * 10**9), ("dgx-a100-40gb", 160 * 10**9)])
def test_plan_fits_a_stage_exactly_at_its_machines_memory(capsys, machine, at):
    """P_os+g+p holds 16Ψ/N_d: at N_d = 64 the machine's 80 (40) GB hold Ψ = 320B (160B) exactly,
    and one parameter more does not fit."""
    fits = [plan_json(capsys, "--machine", machine, "--stage", "3", "--params", str(psi))[0]["rows"][0][4]
            for psi in (at, at + 1)]
    assert fits == [True, False]


def test_table1_on_a_machine_bolds_where_its_gpu_fits(capsys):
    """`--table1 --machine dgx-a100-80gb` is the Table 1 of `--gpu-mem 80GB`: the caption's fit
    moves with the machine's memory."""
    assert without_notes(plan_json(capsys, "--table1", "--machine", "dgx-a100-80gb")) == \
        without_notes(plan_json(capsys, "--table1", "--gpu-mem", "80GB"))
    assert without_notes(plan_json(capsys, "--table1", "--machine", "dgx-a100-80gb")) != \
        without_notes(plan_json(capsys, "--table1"))


def test_scale_on_a_machine_marks_the_stage_that_does_not_fit(capsys):
    """7.5B on 64 GPUs: plain DP's 120 GB of model states does not fit a DGX H100's 80 GB GPU,
    P_os+g+p's 1.9 GB and its activations do; the note names the machine."""
    rc, out, _ = run_cli(capsys, "scale", "--preset", "7.5B", "--gpus", "64", "--stages", "0,3",
                         "--machine", "dgx-h100")
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| ")]
    assert rc == 0 and rows[0][-2:] == ["peak /GPU (B)", "fits 80 GB? |"]
    assert [(r[0], r[-1]) for r in rows[1:]] == [("| DP", "no |"), ("| P_os+g+p", "yes |")]
    assert "--machine dgx-h100, DGX H100" in out


@pytest.mark.parametrize("command", ["plan", "scale"])
def test_an_unknown_machine_is_one_line_listing_the_accepted_names(capsys, command):
    """`--machine dgx-b200`: exit code 2, one line naming the value and every accepted name."""
    assert_usage_error(capsys, command, "--machine", "dgx-b200",
                       named=f"unknown machine 'dgx-b200'; accepted: {NAMES}")


@pytest.mark.parametrize("command", ["plan", "scale"])
def test_help_lists_the_machines(capsys, command):
    """`zerospec plan --help` and `zerospec scale --help` name every accepted machine."""
    with pytest.raises(SystemExit):
        run_cli(capsys, command, "--help")
    assert NAMES in " ".join(capsys.readouterr().out.split())


def test_scale_without_a_machine_prints_its_table_unchanged(capsys):
    """`--machine` only appends two columns and a note: the rest of the table is what `scale`
    prints without it, and that has no fit column."""
    tiny = ("scale", "--layers", "2", "--hidden", "16", "--heads", "2", "--vocab", "37", "--seq", "8",
            "--gpus", "4")
    table = lambda out: [l for l in out.splitlines() if l.startswith("|")]   # noqa: E731
    plain, with_machine = run_cli(capsys, *tiny)[1], run_cli(capsys, *tiny, "--machine", "dgx2")[1]
    assert "fits" not in plain and "Fits" not in plain
    drop_two = lambda l: "|".join(l.split("|")[:-3]) + "|"                 # noqa: E731
    assert [drop_two(l) for l in table(with_machine)] == table(plain)


def test_plan_on_a_machine_answers_without_importing_torch():
    """`plan --machine dgx-h100` stays a closed-form answer: the machines are data, no torch."""
    import subprocess
    import sys
    code = ("import sys; from zerospec.__main__ import main; "
            "rc = main(['plan', '--machine', 'dgx-h100']); print(rc, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.splitlines()[-1] == "0 False", done.stderr
