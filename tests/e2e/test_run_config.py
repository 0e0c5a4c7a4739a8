"""``kfoundry run --config FILE``: run options from a TOML file, the command line's flags over it;
a bad file, an unknown option or a value the option refuses is one ``kfoundry:`` line (exit 2)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from actors.commands.cli import build_parser
from actors.commands.run_config import apply_config
from actors.runtime.errors import ConfigError
from tests.e2e.helpers import cli_env as _env
from tests.e2e.helpers import kfoundry as _kfoundry

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "examples" / "quickstart.py")


def _parsed(argv: list[str]) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    apply_config(args.run_parser, argv[1:], args)
    return args


def test_options_come_from_the_file_and_the_command_line_wins(tmp_path: Path) -> None:
    config = tmp_path / "conf" / "run.toml"
    config.parent.mkdir()
    config.write_text(
        'islands = 3\nseconds = 7\nexperts = "template"\neval_timeout = 42\n'
        '[run]\nprecision = "exact"\nno-migration = true\nseed-candidate = ["seeds/a.py", "/abs/b.py"]\n'
        'run-dir = "out"\nquiet = false\n'
    )
    args = _parsed(["run", QUICKSTART, "--config", str(config), "--seconds", "9", "--islands", "2"])
    assert (args.islands, args.seconds) == (2, 9.0)  # given on the command line, equal to a default or not
    assert (args.experts, args.eval_timeout, args.precision) == ("template", 42.0, "exact")
    assert (args.no_migration, args.quiet) == (True, False)
    assert args.seed_candidate == [config.parent / "seeds" / "a.py", Path("/abs/b.py")]  # relative to the file
    assert args.run_dir == config.parent / "out"
    plain = _parsed(["run", QUICKSTART])  # no file: the parser's defaults, untouched
    assert (plain.islands, plain.seconds, plain.precision) == (2, None, "reference")


_BAD_FILES = {
    "unknown": ("islandz = 3\n", "'islandz' is not a `kfoundry run` option (options: "),
    "type": ('islands = "three"\n', "islands = 'three': not a valid int (invalid literal"),
    "choice": ('precision = "half"\n', "precision = 'half': choose one of reference, exact"),
    "switch": ("no-migration = 1\n", "no-migration = 1: a switch takes true or false"),
    "bool-value": ("seconds = true\n", "seconds = True: --seconds takes a value, not true or false"),
    "list": ("islands = [1, 2]\n", "islands = [1, 2]: one value, not a list"),
    "not-toml": ("islands = \n", "not a TOML file ("),
    "section": ("[evaluator]\nspares = 2\n", "[evaluator] is not a section this file may have (only [run])"),
    "twice": ("islands = 2\n[run]\nislands = 3\n", "'islands' is set both at the top level and in [run]"),
    "range": ("seconds = -5\n", "--seconds must be > 0, got -5"),  # the same check as the flag's
}
"""Bad run configuration files and what ``kfoundry run`` says of each."""

_STARTED_BY_DEFAULT = {"unknown", "range"}
"""The files the default run starts ``kfoundry`` on: one the reader refuses and one whose value
the flag's own check refuses (~2-5 s each; the slow run starts it on every file). Every refusal of
the reader is checked in process too."""


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("text", "line"),
    [
        pytest.param(*bad, id=name, marks=() if name in _STARTED_BY_DEFAULT else pytest.mark.slow)
        for name, bad in _BAD_FILES.items()
    ],
)
def test_a_bad_configuration_file_is_one_line(text: str, line: str, tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text(text)
    proc = _kfoundry("run", QUICKSTART, "--device", "cpu", "--config", str(config), env=_env(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr
    assert proc.stderr.startswith("kfoundry: "), proc.stderr
    assert line in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("text", "line"), [pytest.param(*bad, id=name) for name, bad in _BAD_FILES.items() if name != "range"]
)
def test_a_bad_configuration_file_is_refused_naming_what_is_wrong(text: str, line: str, tmp_path: Path) -> None:
    """The reader's refusals, in process: each a :class:`ConfigError` that names the file and
    what is wrong (``kfoundry`` prints it as its one line, above)."""
    config = tmp_path / "run.toml"
    config.write_text(text)
    with pytest.raises(ConfigError) as refused:
        _parsed(["run", QUICKSTART, "--device", "cpu", "--config", str(config)])
    assert str(refused.value).startswith(f"--config {config}: "), refused.value
    assert line in str(refused.value), refused.value


@pytest.mark.timeout(60)
def test_a_missing_configuration_file_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    proc = _kfoundry("run", QUICKSTART, "--config", str(missing), env=_env(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"kfoundry: --config {missing}: cannot read it (No such file or directory)\n"
