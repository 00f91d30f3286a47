"""A character-level LSTM language model: `lax.scan` over time, Adagrad by hand, sampling in a scan.

In the style of the JAX ports of Karpathy's min-char-rnn: a fixed text, windows of it drawn at
random inside the jitted step (`random.randint`, `jax.vmap` of `lax.dynamic_slice`), an LSTM cell
unrolled over the window by `lax.scan`, Adagrad with elementwise gradient clipping over the
params pytree, and text sampled with `random.categorical` from keys that a second `lax.scan`
walks. Only the imports name glue; `examples/check_against_jax.py` runs the same source under JAX.

    python -m examples.char_rnn
"""
import functools

import glue as jax
import glue.numpy as jnp
from glue import lax, random

TEXT = ("a compiler turns programs into kernels. a kernel reads arrays and writes arrays. "
        "fusion puts many small steps into one kernel, so fewer arrays go through memory. ")
CHARS = sorted(set(TEXT))
VOCAB = len(CHARS)


def encode(text):
    return jnp.array([CHARS.index(c) for c in text], dtype=jnp.int32)


def decode(tokens):
    return "".join(CHARS[int(t)] for t in tokens)


def init_params(key, vocab_size, embed_size=16, hidden_size=32):
    k_embed, k_x, k_h, k_out = random.split(key, 4)
    return {
        "embed": random.normal(k_embed, (vocab_size, embed_size)) * 0.1,
        "lstm": {
            "wx": random.normal(k_x, (embed_size, 4 * hidden_size)) / jnp.sqrt(embed_size),
            "wh": random.normal(k_h, (hidden_size, 4 * hidden_size)) / jnp.sqrt(hidden_size),
            # A forget-gate bias of one keeps the cell's memory at the start of training.
            "b": jnp.zeros(4 * hidden_size).at[hidden_size:2 * hidden_size].set(1.0),
        },
        "out": {"w": random.normal(k_out, (hidden_size, vocab_size)) / jnp.sqrt(hidden_size),
                "b": jnp.zeros(vocab_size)},
    }


def lstm_cell(params, carry, x):
    h, c = carry
    gates = x @ params["wx"] + h @ params["wh"] + params["b"]
    i, f, g, o = jnp.split(gates, 4, axis=-1)
    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    h = jax.nn.sigmoid(o) * jnp.tanh(c)
    return (h, c), h


def initial_state(params, batch_size):
    hidden_size = params["lstm"]["wh"].shape[0]
    return jnp.zeros((batch_size, hidden_size)), jnp.zeros((batch_size, hidden_size))


def forward(params, inputs):
    """Logits (batch, time, vocab) for token ids (batch, time)."""
    xs = jnp.swapaxes(params["embed"][inputs], 0, 1)  # scan runs over the leading (time) axis
    _, hs = lax.scan(functools.partial(lstm_cell, params["lstm"]), initial_state(params, inputs.shape[0]), xs)
    logits = hs @ params["out"]["w"] + params["out"]["b"]
    return jnp.swapaxes(logits, 0, 1)


def loss_fn(params, inputs, targets):
    logprobs = jax.nn.log_softmax(forward(params, inputs))
    return -jnp.mean(jnp.sum(jax.nn.one_hot(targets, VOCAB) * logprobs, axis=-1))


def get_batch(key, data, batch_size, seq_len):
    starts = random.randint(key, (batch_size,), 0, data.shape[0] - seq_len - 1)
    windows = jax.vmap(lambda s: lax.dynamic_slice(data, (s,), (seq_len + 1,)))(starts)
    return windows[:, :-1], windows[:, 1:]


BATCH_SIZE = 8
SEQ_LEN = 16
LEARNING_RATE = 0.1


@functools.partial(jax.jit, static_argnames=("batch_size", "seq_len"))
def train_step(params, memory, key, data, batch_size=BATCH_SIZE, seq_len=SEQ_LEN, learning_rate=LEARNING_RATE):
    inputs, targets = get_batch(key, data, batch_size, seq_len)
    loss, grads = jax.value_and_grad(loss_fn)(params, inputs, targets)
    grads = jax.tree_util.tree_map(lambda g: jnp.clip(g, -5.0, 5.0), grads)
    memory = jax.tree_util.tree_map(lambda m, g: m + g * g, memory, grads)
    params = jax.tree_util.tree_map(lambda p, g, m: p - learning_rate * g / jnp.sqrt(m + 1e-8),
                                    params, grads, memory)
    return params, memory, loss


@functools.partial(jax.jit, static_argnames=("length",))
def sample(params, key, first_token, length):
    def step(carry, key):
        state, token = carry
        state, h = lstm_cell(params["lstm"], state, params["embed"][token][None])
        logits = h[0] @ params["out"]["w"] + params["out"]["b"]
        token = random.categorical(key, logits)
        return (state, token), token

    _, tokens = lax.scan(step, (initial_state(params, 1), first_token), random.split(key, length))
    return tokens


def main(steps=60, seed=0):
    data = encode(TEXT)
    key = random.PRNGKey(seed)
    key, init_key, sample_key = random.split(key, 3)
    params = init_params(init_key, VOCAB)
    memory = jax.tree_util.tree_map(jnp.zeros_like, params)
    losses = []
    for _ in range(steps):
        key, batch_key = random.split(key)
        params, memory, loss = train_step(params, memory, batch_key, data)
        losses.append(float(loss))
    print("sample:", decode(sample(params, sample_key, data[0], length=40)))
    return losses


if __name__ == "__main__":
    for step, loss in enumerate(main()):
        print(f"step {step:3d}  loss {loss:.5f}")
