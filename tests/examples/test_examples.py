"""The examples (examples/*.py: JAX programs whose only glue lines are their imports) trained for
a few steps, against losses that are justified without JAX (not installed here):

- the first loss against a float64 NumPy re-implementation of each model, written apart from
  the example, on the example's own initial params and first batch;
- glue's gradient of that loss against central differences of the NumPy loss along a random
  direction (every later step follows from the first loss and its gradient);
- the losses of a few steps on the CPU backend against the stored ones (glue's own, recorded
  when the two checks above passed), the reference backend against the same, and the loss
  falling.

`examples/check_against_jax.py` compares with JAX itself where jax is installed; its rewriting
of the imports is tested here with glue standing in for jax.
"""
import sys

import numpy as np
import pytest

import glue
from examples import char_rnn, check_against_jax, gpt, mnist_mlp
from glue import random

# glue's CPU losses of main(steps=len(...), seed=0).
STORED = {
    "mnist_mlp": [2.385308265686035, 2.363320827484131, 2.3353710174560547, 2.297563314437866, 2.1351068019866943],
    "gpt": [3.491960048675537, 3.3724682331085205, 3.347489595413208],
    "char_rnn": [3.127366542816162, 2.8864755630493164, 3.0597243309020996, 2.8769214153289795, 2.6311278343200684],
}
MODULES = {"mnist_mlp": mnist_mlp, "gpt": gpt, "char_rnn": char_rnn}


def _numpy(tree):
    return glue.tree_util.tree_map(lambda x: np.asarray(x, np.float64) if np.asarray(x).dtype.kind == "f"
                                   else np.asarray(x), tree)


def _log_softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def _sigmoid(z):
    return 1 / (1 + np.exp(-z))


def mnist_loss(params, images, onehot):
    h = images
    for w, b in params[:-1]:
        h = np.tanh(h @ w + b)
    w, b = params[-1]
    return -(_log_softmax(h @ w + b) * onehot).sum(axis=1).mean()


def gpt_loss(params, tokens, targets, n_head):
    def norm(p, x):
        centred = x - x.mean(-1, keepdims=True)
        return centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + 1e-5) * p["g"] + p["b"]

    def heads(t):  # (B, T, C) -> (B, heads, T, C / heads)
        return t.reshape(B, T, n_head, -1).transpose(0, 2, 1, 3)

    B, T = tokens.shape
    x = params["wte"][tokens] + params["wpe"][:T]
    future = np.triu(np.ones((T, T), bool), 1)
    for layer in range(params["blocks"]["attn"]["w"].shape[0]):  # the blocks' params are stacked
        blk = glue.tree_util.tree_map(lambda a: a[layer], params["blocks"])
        h = norm(blk["ln_1"], x)
        q, k, v = map(heads, np.split(h @ blk["attn"]["w"] + blk["attn"]["b"], 3, axis=-1))
        scores = np.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(q.shape[-1])
        weights = np.exp(_log_softmax(np.where(future, -np.inf, scores)))
        y = np.einsum("bhqk,bhkd->bqhd", weights, v).reshape(x.shape)
        x = x + y @ blk["attn_proj"]["w"] + blk["attn_proj"]["b"]
        u = norm(blk["ln_2"], x) @ blk["fc"]["w"] + blk["fc"]["b"]
        gelu = 0.5 * u * (1 + np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u ** 3)))
        x = x + gelu @ blk["mlp_proj"]["w"] + blk["mlp_proj"]["b"]
    logp = _log_softmax(norm(params["ln_f"], x) @ params["wte"].T)
    return -np.take_along_axis(logp, targets[..., None], axis=-1).mean()


def rnn_loss(params, tokens, targets):
    cell, (B, T) = params["lstm"], tokens.shape
    H = cell["wh"].shape[0]
    h = c = np.zeros((B, H))
    nll = 0.0
    for t in range(T):
        z = params["embed"][tokens[:, t]] @ cell["wx"] + h @ cell["wh"] + cell["b"]
        c = _sigmoid(z[:, H:2 * H]) * c + _sigmoid(z[:, :H]) * np.tanh(z[:, 2 * H:3 * H])
        h = _sigmoid(z[:, 3 * H:]) * np.tanh(c)
        logp = _log_softmax(h @ params["out"]["w"] + params["out"]["b"])
        nll -= logp[np.arange(B), targets[:, t]].sum()
    return nll / (B * T)


def first_step(name):
    """The example's initial params, its first batch (drawn as its main draws them), its loss
    function with the batch bound, and the NumPy re-implementation of that loss."""
    key = random.PRNGKey(0)
    if name == "mnist_mlp":
        data_key, init_key, shuffle_key = random.split(key, 3)
        images, labels = mnist_mlp.synthetic_digits(data_key, mnist_mlp.NUM_TRAIN)
        params = mnist_mlp.init_random_params(mnist_mlp.PARAM_SCALE, mnist_mlp.LAYER_SIZES, init_key)
        batch = next(mnist_mlp.data_stream(shuffle_key, images, labels, mnist_mlp.BATCH_SIZE))
        return params, lambda p: mnist_mlp.loss(p, batch), lambda p: mnist_loss(p, *_numpy(batch))
    if name == "gpt":
        key, init_key = random.split(key)
        params = gpt.init_params(init_key, **gpt.CONFIG)
        _, batch_key = random.split(key)
        batch = gpt.get_batch(batch_key, gpt.BATCH_SIZE, gpt.CONFIG["block_size"], gpt.CONFIG["vocab_size"])
        n_head = gpt.CONFIG["n_head"]
        return (params, lambda p: gpt.loss_fn(p, *batch, n_head),
                lambda p: gpt_loss(p, *_numpy(batch), n_head))
    key, init_key, _ = random.split(key, 3)
    params = char_rnn.init_params(init_key, char_rnn.VOCAB)
    _, batch_key = random.split(key)
    batch = char_rnn.get_batch(batch_key, char_rnn.encode(char_rnn.TEXT), char_rnn.BATCH_SIZE, char_rnn.SEQ_LEN)
    return params, lambda p: char_rnn.loss_fn(p, *batch), lambda p: rnn_loss(p, *_numpy(batch))


@pytest.fixture(scope="module")
def cpu_losses():
    with glue.config.override(backend="cpu"):
        return {name: MODULES[name].main(steps=len(stored), seed=0) for name, stored in STORED.items()}


@pytest.mark.parametrize("name", list(STORED))
def test_first_loss_and_its_gradient_agree_with_numpy(name, cpu_losses):
    with glue.config.override(backend="reference"):
        params, loss, numpy_loss = first_step(name)
        value, grads = glue.value_and_grad(loss)(params)
    params, grads = _numpy(params), _numpy(grads)
    want = numpy_loss(params)
    np.testing.assert_allclose(float(value), want, rtol=1e-5)
    np.testing.assert_allclose(cpu_losses[name][0], want, rtol=1e-5)

    # Each leaf's gradient along a random direction, against central differences.
    leaves, treedef = glue.tree_util.tree_flatten(params)
    rng = np.random.default_rng(1)
    eps = 1e-5
    for i, (leaf, grad) in enumerate(zip(leaves, glue.tree_util.tree_leaves(grads))):
        direction = rng.standard_normal(leaf.shape)
        shifted = [numpy_loss(glue.tree_util.tree_unflatten(treedef, leaves[:i] + [leaf + s * eps * direction]
                                                            + leaves[i + 1:])) for s in (1, -1)]
        slope = (shifted[0] - shifted[1]) / (2 * eps)
        assert abs(np.sum(grad * direction) - slope) <= 1e-3 * np.linalg.norm(grad) + 1e-8, (name, i)


@pytest.mark.parametrize("name", list(STORED))
def test_a_few_steps_give_the_stored_losses_and_the_loss_falls(name, cpu_losses):
    np.testing.assert_allclose(cpu_losses[name], STORED[name], rtol=1e-4)
    with glue.config.override(backend="reference"):
        np.testing.assert_allclose(MODULES[name].main(steps=len(STORED[name]), seed=0), STORED[name], rtol=1e-4)
    assert cpu_losses[name][-1] < cpu_losses[name][0] - 0.1


def test_check_against_jax_rewrites_only_the_import_lines():
    source = ('"""Runs on glue."""\nimport glue as jax\nfrom glue.scipy.special import (\n    logsumexp)\n'
              'import glueish\n\ndef f(x):  # glue\n    return jax.numpy.sum(x)\n')
    assert check_against_jax.swap_imports(source) == source.replace("import glue as", "import jax as").replace(
        "from glue.scipy", "from jax.scipy")
    with pytest.raises(ValueError, match="line 3 names glue outside the imports"):
        check_against_jax.swap_imports("import glue as jax\n\nx = glue.numpy.ones(3)\n")
    for name in STORED:
        source = (check_against_jax.HERE / f"{name}.py").read_text()
        swapped = check_against_jax.swap_imports(source)
        changed = [i for i, (a, b) in enumerate(zip(source.splitlines(), swapped.splitlines()), 1) if a != b]
        assert changed and set(changed) <= check_against_jax.import_lines(source)
        assert "glue" not in "".join(swapped.splitlines()[i - 1] for i in changed)


def test_check_against_jax_runs_the_rewritten_programs(monkeypatch, capsys):
    # glue stands in for jax: the rewritten sources must import and train as the originals do.
    for name in ("jax", "jax.numpy", "jax.scipy", "jax.scipy.special"):
        monkeypatch.setitem(sys.modules, name, sys.modules[name.replace("jax", "glue", 1)])
    settings = glue.config.describe()
    with glue.config.override(backend="reference"):  # glue's side is told; the stand-in jax is not
        assert check_against_jax.main(["--steps", "2", "--backend", "reference"]) == 0
    assert glue.config.describe() == settings  # it changed no setting for good
    out = capsys.readouterr().out
    assert out.count(": agree (rtol 0.001)") == len(STORED), out
