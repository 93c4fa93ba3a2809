"""The Python environment a job names (issue 27): the spec field, what a node offers (TETO_ENVIRONMENTS), the
submit refusal when no node offers it, the interpreter and variables the run gets, and ``teto env create``'s
pure parts."""

from __future__ import annotations

import os

import pytest

from agents.executor import launch, pyenv
from agents.executor.settings import ExecutorSettings
from libs.contracts.agents import RunJob
from libs.contracts.jobs import JobSpec
from libs.runtime.settings import SettingsError
from services.queue.domain.lifecycle import Refusal
from services.queue.domain.submits import Target, environment_refusal, environments_named, submit_refusal
from teto.cli_env import EnvError, extras_requirements, pth_lines
from tests.support import builders

pytestmark = pytest.mark.unit


def command_spec(environment: str | None = None, command: list[str] | None = None) -> JobSpec:
    return builders.command_spec(*(command or ["python", "train.py"]), environment=environment)


# -- the spec field -------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("given", "kept"), [("/opt/teto/env", "/opt/teto/env"), ("/opt/teto/env/", "/opt/teto/env"),
                                             ("/usr/bin/python3.11", "/usr/bin/python3.11"), (None, None)])
def test_an_environment_is_an_absolute_path(given, kept):
    assert command_spec(given).environment == kept


@pytest.mark.parametrize("given", ["venv", "./env", "/a,/b", "/a\nb", ""], ids=repr)
def test_anything_else_is_refused(given):
    with pytest.raises(ValueError):
        command_spec(given)


# -- what a node offers ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "offered"), [
    ("", []), ("/opt/a", ["/opt/a"]), (" /opt/a/ , /usr/bin/python3 ,,/opt/a", ["/opt/a", "/usr/bin/python3"]),
], ids=["none", "one", "several"])
def test_teto_environments_lists_absolute_paths(value, offered):
    assert pyenv.parse(value) == offered


def test_a_relative_environment_is_a_settings_error(tmp_path):
    with pytest.raises(ValueError, match="not an absolute path"):
        pyenv.parse("/opt/a,venv")
    with pytest.raises(SettingsError, match="not an absolute path"):
        ExecutorSettings.from_env(env={"TETO_ENVIRONMENTS": "venv"}, data_dir=tmp_path).check()


@pytest.mark.parametrize(("environment", "offered", "refused"), [
    ("/opt/a", ["/opt/a"], None), ("/opt/a", ["/opt/b", "/opt/a"], None),
    ("/opt/a", [], "(TETO_ENVIRONMENTS: none)"), ("/opt/a", ["/opt/b"], "(TETO_ENVIRONMENTS: /opt/b)"),
])
def test_a_node_runs_only_the_environments_it_offers(environment, offered, refused):
    why = pyenv.refusal(environment, offered)
    assert (why is None) if refused is None else (why.startswith("the Python environment /opt/a is not offered")
                                                  and why.endswith(refused))


# -- refused at submit when no node offers it -----------------------------------------------------------------

EXISTING = {("default", "default"): Target(True, True)}


def test_the_environments_named_are_the_only_ones_looked_up():
    assert environments_named([command_spec("/b"), command_spec(), command_spec("/a"), command_spec("/b")]) == [
        "/a", "/b"]
    assert environments_named([command_spec()]) == []


@pytest.mark.parametrize(("environment", "offered", "refused"), [
    (None, frozenset(), False), ("/opt/a", frozenset({"/opt/a"}), False), ("/opt/a", frozenset(), True),
    ("/opt/a", frozenset({"/opt/b"}), True),
], ids=["none-named", "offered", "nobody", "another"])
def test_a_job_naming_an_environment_no_node_offers_is_refused_at_submit(environment, offered, refused):
    got = submit_refusal(command_spec(environment), "default", None, EXISTING, offered)
    assert (got is not None) is refused
    if refused:
        assert got == Refusal("no node offers the Python environment /opt/a (prepare it on the nodes with teto env "
                              "create and list it in their TETO_ENVIRONMENTS)", {"environment": "/opt/a"})
    assert environment_refusal(command_spec(environment), offered) == got


# -- the run's interpreter and variables ----------------------------------------------------------------------

@pytest.mark.parametrize(("command", "runs"), [
    (["python", "t.py"], ["/e/bin/python", "t.py"]), (["python3", "-m", "x"], ["/e/bin/python", "-m", "x"]),
    (["python3.11", "t.py"], ["/e/bin/python", "t.py"]), (["/usr/bin/python3", "t.py"], ["/usr/bin/python3", "t.py"]),
    (["accelerate", "launch", "t.py"], ["accelerate", "launch", "t.py"]), (["pythonista"], ["pythonista"]),
], ids=["python", "python3", "python3.11", "absolute", "other-program", "not-python"])
def test_a_bare_python_becomes_the_environment_s(command, runs):
    assert pyenv.argv(command, pyenv.of("/e", is_dir=True)) == runs


def test_activation_puts_its_bin_first_and_names_the_prefix():
    venv, conda, bare = (pyenv.of("/e", is_dir=True), pyenv.of("/c", is_dir=True, conda=True),
                         pyenv.of("/usr/local/bin/python3.12", is_dir=False))
    assert pyenv.variables(venv, {"PATH": "/usr/bin"}) == {"PATH": f"/e/bin{os.pathsep}/usr/bin", "VIRTUAL_ENV": "/e"}
    assert pyenv.variables(conda, {}) == {"PATH": "/c/bin", "CONDA_PREFIX": "/c"}
    assert pyenv.variables(bare, {"PATH": "/bin"}) == {"PATH": f"/usr/local/bin{os.pathsep}/bin"}


def _grant(environment: str | None, command: list[str] | None = None) -> RunJob:
    return builders.grant(command_spec(environment, command))


def _venv(root) -> str:
    (root / "env" / "bin").mkdir(parents=True)
    python = root / "env" / "bin" / "python"
    python.symlink_to(os.path.realpath("/usr/bin/env"))  # anything executable stands for an interpreter here
    return str(root / "env")


def test_the_agent_runs_the_command_with_the_environment(tmp_path):
    env = _venv(tmp_path)
    settings = ExecutorSettings.from_env(env={}, data_dir=tmp_path, executor_id="ex-1", environments=env,
                                         workload_python="/usr/bin/python3.11")
    got = launch.build(_grant(env), settings, [], resume_from=None, base_env={"PATH": "/usr/bin"})
    assert got.argv == [f"{env}/bin/python", "train.py"]
    assert got.env["PATH"] == f"{env}/bin{os.pathsep}/usr/bin" and got.env["VIRTUAL_ENV"] == env
    # teto.sdk stays importable; the agent's own packages would shadow the environment's: left out
    assert got.env["PYTHONPATH"].split(os.pathsep) == [str(launch.PROJECT_ROOT)]
    plain = launch.build(_grant(None), settings, [], resume_from=None, base_env={"PATH": "/usr/bin"})
    assert plain.argv == ["python", "train.py"] and "VIRTUAL_ENV" not in plain.env


@pytest.mark.parametrize(("offered", "says"), [("", "is not offered on this node"),
                                               ("/nowhere", "is not offered on this node")])
def test_an_environment_the_node_does_not_offer_cannot_start(tmp_path, offered, says):
    settings = ExecutorSettings.from_env(env={}, data_dir=tmp_path, executor_id="ex-1", environments=offered)
    with pytest.raises(launch.CannotStart, match=says):
        launch.build(_grant("/opt/a"), settings, [], resume_from=None, base_env={})


def test_an_offered_environment_that_is_gone_cannot_start(tmp_path):
    settings = ExecutorSettings.from_env(env={}, data_dir=tmp_path, executor_id="ex-1", environments="/gone")
    with pytest.raises(launch.CannotStart, match="has no interpreter at /gone"):
        launch.build(_grant("/gone"), settings, [], resume_from=None, base_env={})


# -- teto env create and teto submit --------------------------------------------------------------------------

REQUIRES = ["pydantic>=2", 'transformers<6,>=5.23; extra == "hf"', "peft==0.21; extra == 'hf'",
            'lightning<2.7,>=2.6; extra == "lightning"', 'pytest; extra == "dev"']


@pytest.mark.parametrize(("extras", "wanted"), [
    ([], []), (["hf"], ["transformers<6,>=5.23", "peft==0.21"]),
    (["hf", " lightning", ""], ["transformers<6,>=5.23", "peft==0.21", "lightning<2.7,>=2.6"]),
])
def test_env_create_installs_what_the_extras_add(extras, wanted):
    assert extras_requirements(REQUIRES, extras) == wanted


def test_an_extra_naming_teto_s_own_extras_adds_theirs_never_a_package_called_teto():
    requires = [*REQUIRES, 'teto[hf,lightning]; extra == "all"', 'teto[all]; extra == "dev"', 'TETO[dev]; extra == "dev"']
    assert extras_requirements(requires, ["dev"]) == ["pytest", "transformers<6,>=5.23", "peft==0.21",
                                                      "lightning<2.7,>=2.6"]
    assert extras_requirements(requires, ["all", "hf"]) == ["transformers<6,>=5.23", "peft==0.21", "lightning<2.7,>=2.6"]
    assert not [r for r in extras_requirements(requires, ["dev", "all"]) if r.lower().startswith("teto")]


def test_env_create_refuses_an_extra_the_project_lacks():
    with pytest.raises(EnvError, match="teto has no extra gpu"):
        extras_requirements(REQUIRES, ["hf", "gpu"])


def test_the_environment_sees_the_sdk_and_the_installation_s_packages_after_its_own(tmp_path):
    assert pth_lines(tmp_path / "teto", [tmp_path / "site", tmp_path / "site"]) == [str(tmp_path / "teto"),
                                                                                     str(tmp_path / "site")]


def test_submit_names_the_environment():
    from teto.cli import build_parser
    from teto.cli_client import build_spec

    args = build_parser().parse_args(["submit", "--environment", "/opt/teto/env", "--", "python", "t.py"])
    assert build_spec(args)["environment"] == "/opt/teto/env"
    assert "environment" not in build_spec(build_parser().parse_args(["submit"]))
