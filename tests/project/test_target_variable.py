"""LOOPRL_TARGET: the default target named by the environment, read at each call, so the
suite (and a user) can run on an AVX-512 host as if it were an AVX2-only one."""

import pytest

import looprl
from looprl import target as target_module
from looprl.ir.nest import initial_nest
from looprl.measurement.keys import measurement_key, peak_key
from looprl.policy.loading import default_policy_dir, load_policy
from looprl.policy.rollout import policy_actions
from looprl.target import TARGET_VARIABLE, Target, host_target

AVX2_ONLY_CPU = ("znver3", "+sse4.2,+avx,+avx2,+fma,+f16c,-avx512f,-avx512bw,-avx512bf16")


@pytest.fixture
def avx2_only_host(monkeypatch):
    """This process sees a Zen 3 (AVX2, no AVX-512) as its host."""
    monkeypatch.setattr(target_module, "host_cpu", lambda: AVX2_ONLY_CPU)


def test_unset_or_host_the_default_is_the_host(monkeypatch):
    monkeypatch.delenv(TARGET_VARIABLE, raising=False)
    assert Target.default() == Target.resolve(None) == Target.named("host") == host_target() == Target.host()
    for value in ("host", " HOST ", ""):
        monkeypatch.setenv(TARGET_VARIABLE, value)
        assert Target.default() == Target.host()


@pytest.mark.parametrize("name", ["avx2", "sse4", "AVX2"])
def test_a_named_class_becomes_every_default_and_the_host_stays_the_machine(monkeypatch, name):
    real = Target.host()
    monkeypatch.setenv(TARGET_VARIABLE, name)
    wanted = Target.named(name.lower())
    assert Target.default() == Target.resolve(None) == Target.named("host") == host_target() == wanted
    assert Target.host() == real  # the real machine, for "can this run here" and reports
    assert looprl.compile(initial_nest(looprl.matmul(8, 8, 8))).target == wanted
    assert measurement_key() == measurement_key(wanted) and peak_key() == peak_key(wanted)


def test_the_variable_is_read_at_each_call_not_remembered(monkeypatch):
    nest = initial_nest(looprl.matmul(8, 8, 8))
    monkeypatch.setenv(TARGET_VARIABLE, "avx2")
    first = (looprl.compile(nest).target, measurement_key())
    monkeypatch.setenv(TARGET_VARIABLE, "sse4")
    second = (looprl.compile(nest).target, measurement_key())
    assert first[0].isa == "avx2" and second[0].isa == "sse4" and first[1] != second[1]


def test_the_default_shipped_policy_is_the_named_class_s(monkeypatch):
    monkeypatch.setenv(TARGET_VARIABLE, "avx2")
    assert default_policy_dir() == default_policy_dir("avx2")
    assert default_policy_dir(weights=True) == default_policy_dir("avx2", weights=True)
    policy = load_policy("default")
    assert policy.target.isa == "avx2" and policy_actions(policy).target.isa == "avx2"


@pytest.mark.parametrize("value", ["avx1024", "amx", "x86-64-v3", "1"])
def test_an_unknown_name_is_a_value_error_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(TARGET_VARIABLE, value)
    with pytest.raises(ValueError, match=rf"LOOPRL_TARGET=.*is not a target; set it to host, avx512, avx2, sse4"):
        Target.default()
    with pytest.raises(ValueError, match="LOOPRL_TARGET"):
        looprl.compile(initial_nest(looprl.matmul(8, 8, 8)))


def test_a_class_this_host_cannot_run_is_refused_with_what_it_lacks(monkeypatch, avx2_only_host):
    assert Target.host().isa == "avx2"
    monkeypatch.setenv(TARGET_VARIABLE, "avx512")
    with pytest.raises(ValueError, match=r"LOOPRL_TARGET='avx512': this CPU cannot run code for target 'avx512' \(it lacks avx512f\)"):
        Target.resolve(None)
    monkeypatch.setenv(TARGET_VARIABLE, "avx2")
    assert Target.default() == Target.named("avx2")  # a class the host is, or is wider than, is fine
    assert Target.named("avx512").missing_on_host() == ("avx512f",)  # explicit targets: unchanged rule


class _RunOptions:
    """The part of a pytest config that tests/conftest.py's pytest_configure reads."""

    def __init__(self, markexpr: str):
        self.markexpr = markexpr

    def getoption(self, name, default=None):
        return self.markexpr if name == "markexpr" else default


@pytest.mark.parametrize("markexpr", ["target_dependent", ""])
def test_the_readme_s_second_run_stops_only_where_it_names_the_host_s_own_isa(monkeypatch, avx2_only_host, markexpr):
    from tests.conftest import pytest_configure

    monkeypatch.setenv(TARGET_VARIABLE, "avx2")  # the host's own ISA here
    if markexpr:
        with pytest.raises(pytest.exit.Exception, match="own vector ISA") as stopped:
            pytest_configure(_RunOptions(markexpr))
        assert stopped.value.returncode == 0
    else:
        assert pytest_configure(_RunOptions(markexpr)) is None  # the whole suite under a target runs
    monkeypatch.setenv(TARGET_VARIABLE, "sse4")  # another class this host runs: the re-run runs
    assert pytest_configure(_RunOptions(markexpr)) is None
