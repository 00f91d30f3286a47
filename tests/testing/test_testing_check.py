"""`glue.testing.check` / `check_graph`: passing runs, the report of a backend that disagrees,
and which dtype's tolerance applies to each output."""
import importlib

import numpy as np
import pytest

import glue
import glue.numpy as gnp
from glue.ir import dtypes as dt
from glue.ir import parse
from glue.backend.reference import ReferenceBackend
from glue.testing import check, check_graph, tolerance_dtypes

jit_module = importlib.import_module("glue.frontend.jit")
check_module = importlib.import_module("glue.testing.check")
X = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)


class Skewed(ReferenceBackend):
    """The reference, but every float result is 0.1% too large."""

    name = "skewed"

    def lower(self, graph, *, donated=(), name="fn"):
        lowered = super().lower(graph, donated=donated, name=name)
        run = lowered.compile()
        lowered.compile = lambda: lambda *args: [
            np.asarray(o) * np.asarray(1.001, np.asarray(o).dtype) if np.asarray(o).dtype.kind == "f" else o
            for o in run(*args)]
        return lowered


@pytest.fixture
def skewed(monkeypatch):
    real = check_module.get_backend

    def get_backend(name=None):
        return Skewed() if name == "skewed" else real(name)

    monkeypatch.setattr(jit_module, "get_backend", get_backend)
    monkeypatch.setattr(check_module, "get_backend", get_backend)


def test_check_passes_on_a_correct_backend():
    def layer(x, w, *, act):
        y = gnp.tanh(x * w + 0.5) if act == "tanh" else x * w
        return {"y": y, "stats": (y > 0, None)}

    check(layer, X, X[0], act="tanh", static_argnames="act", backends=["reference"])
    check(layer, X, X[0], act="none", static_argnames="act", backends=["reference"], float64_reference=False)
    check(glue.jit(lambda x, n: x * n, static_argnums=1), X, 3, backends=["reference"])


def test_check_reports_the_backend_output_and_errors(skewed):
    with pytest.raises(AssertionError) as info:
        check(lambda x: {"a": x * 2.0, "b": x > 0}, X, backends=["reference", "skewed"])
    message = str(info.value)
    assert message.startswith("<lambda> on the skewed backend: output out['a'] (float32[2, 3], compared at f32")
    assert "6 of 6 elements differ; first at (0, 0)" in message
    assert "max abs error 0.002" in message and "max rel error 0.001" in message


def test_a_loose_enough_scale_accepts_it(skewed):
    check(lambda x: x * 2.0, X, backends=["skewed"], scale=200.0)


def test_check_graph_reports_with_the_program(skewed):
    graph = parse("{ lambda ; a:f32[3] . let\n    b:f32[3] = exp a\n  in (a, b) }")
    check_graph(graph, [np.float32([0, 1, 2])], backends=["reference"])
    with pytest.raises(AssertionError) as info:
        check_graph(graph, [np.float32([0, 1, 2])], backends=["skewed"])
    message = str(info.value)
    assert message.startswith("graph on the skewed backend: output 0 (float32[3], compared at f32 tolerance)")
    assert message.endswith(str(graph))


def test_backend_failures_say_which_backend(monkeypatch):
    class Failing(ReferenceBackend):
        def lower(self, graph, *, donated=(), name="fn"):
            raise glue.BackendError("cannot compile")

    monkeypatch.setattr(check_module, "get_backend", lambda name=None: Failing())
    with pytest.raises(glue.BackendError) as info:
        check_graph(parse("{ lambda ; a:f32[] . let\n  in (a) }"), [np.float32(1)], backends=["failing"])
    assert "while running on the failing backend" in "\n".join(info.value.__notes__)


def test_default_backends_skip_the_reference(monkeypatch):
    monkeypatch.setattr(check_module, "available_backends", lambda: ["reference", "cpu"])
    assert check_module._default_backends(None) == ["cpu"]
    monkeypatch.setattr(check_module, "available_backends", lambda: ["reference"])
    assert check_module._default_backends(None) == ["reference"]
    assert check_module._default_backends(["skewed"]) == ["skewed"]


def test_tolerance_dtypes_follow_the_least_precise_input():
    graph = parse("""\
{ lambda ; a:f32[2] b:f16[2] c:i32[2] . let
    d:f32[2] = convert_element_type[new_dtype=f32] b
    e:f32[2] = add a d
    f:f32[2] = mul a a
    g:i32[2] = convert_element_type[new_dtype=i32] e
    h:bf16[2] = convert_element_type[new_dtype=bf16] a
    i:f64[2] = convert_element_type[new_dtype=f64] h
  in (e, f, g, c, i, 1.0:f64) }""")
    assert tolerance_dtypes(graph) == [dt.float16, dt.float32, dt.int32, dt.int32, dt.bfloat16, dt.float64]
