"""An MNIST-style MLP classifier trained from scratch: hand-written SGD with momentum, no libraries.

In the style of JAX's `examples/mnist_classifier_fromscratch.py`, on a synthetic stand-in for
MNIST so that it needs no download: 10 classes of 8x8 "images", each the class's random template
plus Gaussian noise, all drawn from `jax.random`. Only the imports name glue;
`examples/check_against_jax.py` runs the same source under JAX.

    python -m examples.mnist_mlp
"""
import glue as jax
import glue.numpy as jnp
from glue import jit, grad, random
from glue.scipy.special import logsumexp


def init_random_params(scale, layer_sizes, key):
  keys = random.split(key, len(layer_sizes) - 1)
  return [(scale * random.normal(k1, (m, n)), scale * random.normal(k2, (n,)))
          for k, m, n in zip(keys, layer_sizes[:-1], layer_sizes[1:])
          for k1, k2 in [random.split(k)]]


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


def synthetic_digits(key, num_examples, num_classes=10, side=8, noise=0.7):
  """Images of one random template per class with noise on top, flattened, and one-hot labels."""
  k_templates, k_labels, k_noise = random.split(key, 3)
  templates = random.normal(k_templates, (num_classes, side * side))
  labels = random.randint(k_labels, (num_examples,), 0, num_classes)
  images = templates[labels] + noise * random.normal(k_noise, (num_examples, side * side))
  return images.astype(jnp.float32), jax.nn.one_hot(labels, num_classes)


def main(steps=100, seed=0):
  layer_sizes = [64, 32, 32, 10]
  param_scale = 0.1
  step_size = 0.05
  momentum_mass = 0.9
  batch_size = 32
  num_train = 256

  key = random.PRNGKey(seed)
  data_key, init_key, shuffle_key = random.split(key, 3)
  train_images, train_labels = synthetic_digits(data_key, num_train)
  num_batches = num_train // batch_size

  def data_stream(key):
    while True:
      key, subkey = random.split(key)
      perm = random.permutation(subkey, num_train)
      for i in range(num_batches):
        batch_idx = perm[i * batch_size:(i + 1) * batch_size]
        yield train_images[batch_idx], train_labels[batch_idx]

  @jit
  def update(params, velocity, batch):
    loss_value, grads = jax.value_and_grad(loss)(params, batch)
    velocity = jax.tree_util.tree_map(lambda v, g: momentum_mass * v + g, velocity, grads)
    params = jax.tree_util.tree_map(lambda p, v: p - step_size * v, params, velocity)
    return params, velocity, loss_value

  params = init_random_params(param_scale, layer_sizes, init_key)
  velocity = jax.tree_util.tree_map(jnp.zeros_like, params)
  batches = data_stream(shuffle_key)
  losses = []
  for _ in range(steps):
    params, velocity, loss_value = update(params, velocity, next(batches))
    losses.append(float(loss_value))
  print(f"Training set accuracy {float(accuracy(params, (train_images, train_labels))):.3f}")
  return losses


if __name__ == "__main__":
  for step, loss_value in enumerate(main()):
    print(f"step {step:3d}  loss {loss_value:.5f}")
