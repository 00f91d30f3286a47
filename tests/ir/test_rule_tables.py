"""Every rule table that must cover every primitive does, and no table accepts a non-primitive."""
import pytest

import glue.backend_cpu  # noqa: F401  (each layer's tables fill when its modules load)
import glue.backend_cuda.codegen  # noqa: F401
import glue.frontend.transforms  # noqa: F401
import glue.reference  # noqa: F401
import glue.scheduler.lowering  # noqa: F401
from glue.ir import PRIMITIVES, RuleTable


def test_the_layers_tables_are_registered():
    names = {t.name for t in RuleTable.TABLES}
    assert {"reference", "jvp", "vjp", "vmap", "index", "codegen"} <= names


@pytest.mark.parametrize("table", [t for t in RuleTable.TABLES if t.covers is not None], ids=lambda t: t.name)
def test_table_covers_what_it_must(table):
    assert table.missing() == []


def test_a_table_rejects_a_name_that_is_no_primitive():
    table = RuleTable("scratch")
    RuleTable.TABLES.remove(table)
    with pytest.raises(KeyError, match="'expo' is not a primitive"):
        table["expo"] = lambda x: x
    with pytest.raises(KeyError):
        table.update(expo=None)


def test_facts():
    assert PRIMITIVES["exp"].expensive and not PRIMITIVES["add"].expensive
    assert PRIMITIVES["reduce_max"].fold == "max" and PRIMITIVES["add"].fold is None
    assert PRIMITIVES["convert_element_type"].moves_data_only and PRIMITIVES["iota"].moves_data_only
    assert not PRIMITIVES["mul"].moves_data_only
    assert PRIMITIVES["transpose"].linear and not PRIMITIVES["mul"].linear
