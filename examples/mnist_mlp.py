"""An MNIST-style MLP classifier trained from scratch: hand-written SGD with momentum, no libraries.

In the style of JAX's `examples/mnist_classifier_fromscratch.py`, on a synthetic stand-in for
MNIST so that it needs no download: 10 classes of 8x8 "images", each the class's random template
plus Gaussian noise, all drawn from `jax.random`. Only the imports name glue;
`examples/check_against_jax.py` runs the same source under JAX.

    python -m examples.mnist_mlp
"""
import glue as jax
import glue.numpy as jnp
from glue import jit, random
from glue.scipy.special import logsumexp


def init_random_params(scale, layer_sizes, key):
    params = []
    for k, m, n in zip(random.split(key, len(layer_sizes) - 1), layer_sizes[:-1], layer_sizes[1:]):
        w_key, b_key = random.split(k)
        params.append((scale * random.normal(w_key, (m, n)), scale * random.normal(b_key, (n,))))
    return params


def predict(params, inputs):
    activations = inputs
    for w, b in params[:-1]:
        outputs = jnp.dot(activations, w) + b
        activations = jnp.tanh(outputs)

    final_w, final_b = params[-1]
    logits = jnp.dot(activations, final_w) + final_b
    return logits - logsumexp(logits, axis=1, keepdims=True)


def loss(params, batch):
    inputs, targets = batch
    preds = predict(params, inputs)
    return -jnp.mean(jnp.sum(preds * targets, axis=1))


def accuracy(params, batch):
    inputs, targets = batch
    target_class = jnp.argmax(targets, axis=1)
    predicted_class = jnp.argmax(predict(params, inputs), axis=1)
    return jnp.mean(predicted_class == target_class)


def synthetic_digits(key, num_examples, num_classes=10, side=8, noise=1.0):
    """Images of one random template per class with noise on top, flattened, and one-hot labels."""
    k_templates, k_labels, k_noise = random.split(key, 3)
    templates = random.normal(k_templates, (num_classes, side * side))
    labels = random.randint(k_labels, (num_examples,), 0, num_classes)
    images = templates[labels] + noise * random.normal(k_noise, (num_examples, side * side))
    return images.astype(jnp.float32), jax.nn.one_hot(labels, num_classes)


def data_stream(key, images, labels, batch_size):
    """Minibatches without end, in a new random order every epoch."""
    num_train = images.shape[0]
    while True:
        key, subkey = random.split(key)
        perm = random.permutation(subkey, num_train)
        for i in range(num_train // batch_size):
            batch_idx = perm[i * batch_size:(i + 1) * batch_size]
            yield images[batch_idx], labels[batch_idx]


LAYER_SIZES = [64, 32, 32, 10]
PARAM_SCALE = 0.1
STEP_SIZE = 0.05
MOMENTUM_MASS = 0.9
BATCH_SIZE = 32
NUM_TRAIN = 256


@jit
def update(params, velocity, batch):
    loss_value, grads = jax.value_and_grad(loss)(params, batch)
    velocity = jax.tree_util.tree_map(lambda v, g: MOMENTUM_MASS * v + g, velocity, grads)
    params = jax.tree_util.tree_map(lambda p, v: p - STEP_SIZE * v, params, velocity)
    return params, velocity, loss_value


def main(steps=100, seed=0):
    key = random.PRNGKey(seed)
    data_key, init_key, shuffle_key = random.split(key, 3)
    train_images, train_labels = synthetic_digits(data_key, NUM_TRAIN)
    params = init_random_params(PARAM_SCALE, LAYER_SIZES, init_key)
    velocity = jax.tree_util.tree_map(jnp.zeros_like, params)
    batches = data_stream(shuffle_key, train_images, train_labels, BATCH_SIZE)
    losses = []
    for _ in range(steps):
        params, velocity, loss_value = update(params, velocity, next(batches))
        losses.append(float(loss_value))
    print(f"Training set accuracy {float(accuracy(params, (train_images, train_labels))):.3f}")
    return losses


if __name__ == "__main__":
    for step, loss_value in enumerate(main()):
        print(f"step {step:3d}  loss {loss_value:.5f}")
