"""A mapping keyed by names (table overrides, objective weights) names only known ones."""

import pytest

from ssl_rec._checks import check_known_keys
from ssl_rec.hardware import TableSpec
from ssl_rec.lightning.objective_set import check_objectives
from ssl_rec.models import FieldEmbedding
from ssl_rec.objectives import InfoNCE


def test_known_keys_pass_and_unknown_ones_are_listed_sorted_with_the_known() -> None:
    check_known_keys("Owner", "weights", {"b": 1, "a": 2}, ["b", "a", "c"], "things")
    check_known_keys("Owner", "weights", {}, [], "things")
    with pytest.raises(ValueError) as info:
        check_known_keys("Owner", "weights", ["z", "a", "y"], ["b", "a"], "things")
    assert str(info.value) == "Owner.weights names unknown things ['y', 'z']; things are ['b', 'a']"


def test_field_embedding_refuses_an_override_of_no_field() -> None:
    message = "FieldEmbedding.table_overrides names unknown fields ['C9']; fields are ['C2', 'C1']"
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        FieldEmbedding(["C2", "C1"], [5, 5], 4, table_overrides={"C9": TableSpec()})
    emb = FieldEmbedding(["C2", "C1"], [5, 5], 4, table_overrides={"C1": TableSpec("int8")})
    assert [s.precision for s in emb.specs] == ["fp32", "int8"]


def test_objective_weights_name_objectives_only() -> None:
    objectives = {"nce": InfoNCE(), "aux": InfoNCE()}
    assert check_objectives(objectives, {"aux": 0.5}, "M") == {"nce": 1.0, "aux": 0.5}
    with pytest.raises(ValueError, match=r"M\.weights names unknown objectives \['x'\]; "
                                         r"objectives are \['aux', 'nce'\]"):  # fmt: skip
        check_objectives(objectives, {"x": 1.0}, "M")
