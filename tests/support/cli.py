"""The CLI through its real entry point, as the CLI tests call it (``zerospec.__main__.main``)."""
from __future__ import annotations

from zerospec.__main__ import main


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``zerospec *argv`` run in this process."""
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def assert_usage_error(capsys, *argv, named: str) -> None:
    """Bad input: exit code 2, nothing on stdout, one stderr line ``zerospec: error: …`` naming it."""
    rc, out, err = run_cli(capsys, *argv)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("zerospec: error:") and named in err, err
