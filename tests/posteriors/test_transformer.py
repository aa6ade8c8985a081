"""The byte-level transformer, its LoRA adapters and its text (`posteriors.experiments.transformer`), and the
Laplace-LoRA experiment (`posteriors.experiments.lora`)."""

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posteriors.experiments import transformer
from posteriors.experiments.transformer import (
    TEST_PACKAGES,
    TRAIN_PACKAGES,
    add_lora,
    corpus,
    gpt,
    lora_weights,
    windows,
)
from posteriors.weights import path_string
from tests import _draws as draws

from ..linops._util import assert_close


def test_docstring_examples_run():
    result = doctest.testmod(transformer, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_the_model_is_causal():
    """Changing byte t changes the logits at positions t and after, never before."""
    fn, params = gpt(jax.random.key(0), size="small", context=8)
    x = jnp.arange(8, dtype=jnp.int32) + 60
    base = fn(params, x)
    for t in (0, 3, 7):
        moved = fn(params, x.at[t].set(200))
        assert_close(moved[:t], base[:t], rtol=1e-6)
        assert float(jnp.abs(moved[t:] - base[t:]).max()) > 1e-3


def test_lora_adds_the_scaled_low_rank_product_to_the_adapted_kernels():
    fn, params = gpt(jax.random.key(0), size="small", context=8)
    fn_l, params_l = add_lora(fn, params, jax.random.key(1), rank=2, alpha=6.0, targets=("query", "out"))
    x = jnp.arange(8, dtype=jnp.int32)
    assert_close(fn_l(params_l, x), fn(params, x))  # B = 0 at first
    B = draws.normal(jax.random.key(2), (2, 16))
    blocks = [{**b, "query": {**b["query"], "lora_b": B}, "out": {**b["out"], "lora_b": -B}}
              for b in params_l["blocks"]]
    adapted = {**params_l, "blocks": blocks}
    merged = [{**b, "query": {"kernel": b["query"]["kernel"] + 3.0 * a["query"]["lora_a"] @ B,
                              "bias": b["query"]["bias"]},
               "out": {"kernel": b["out"]["kernel"] - 3.0 * a["out"]["lora_a"] @ B, "bias": b["out"]["bias"]}}
              for b, a in zip(params["blocks"], params_l["blocks"], strict=True)]
    assert_close(fn_l(adapted, x), fn({**params, "blocks": merged}, x), rtol=1e-5, atol=1e-5)
    assert float(jnp.abs(fn_l(adapted, x) - fn(params, x)).max()) > 1e-2
    paths = [path_string(p) for p, _ in jax.tree_util.tree_flatten_with_path(adapted)[0]]
    assert [paths[i] for i in lora_weights(adapted).leaves] == [
        "blocks.0.out.lora_a", "blocks.0.out.lora_b", "blocks.0.query.lora_a", "blocks.0.query.lora_b"]
    with pytest.raises(ValueError, match="lora_weights: the parameters hold no adapters"):
        lora_weights(params)
    with pytest.raises(ValueError, match="add_lora: targets must be among"):
        add_lora(fn, params, jax.random.key(1), targets=("mlp",))


def test_the_text_splits_are_disjoint_and_the_bytecode_is_different_bytes():
    assert not set(TRAIN_PACKAGES) & set(TEST_PACKAGES)
    printable = {name: np.mean([32 <= b < 127 or b in (9, 10) for b in corpus(name)[:200_000]])
                 for name in ("train", "test", "docs", "bytecode")}
    assert min(printable["train"], printable["test"], printable["docs"]) > 0.95
    assert printable["bytecode"] < 0.8, printable
    assert corpus("train") == corpus("train")  # a fixed order: reproducible
    x, y = windows(corpus("docs"), 5, 16, jax.random.key(0))
    assert x.shape == y.shape == (5, 16) and x.dtype == jnp.int32
    assert bool((x[:, 1:] == y[:, :-1]).all())
    text = corpus("docs")
    assert all(bytes(np.asarray(x[i]).astype(np.uint8)) in text for i in range(5))
    with pytest.raises(ValueError, match="corpus: split must be"):
        corpus("valid")


@pytest.mark.slow
def test_the_laplace_lora_experiment_runs_and_records_both_rows():
    from posteriors.experiments import lora

    result = doctest.testmod(lora, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
