"""`glue.scipy`: the parts of `jax.scipy` glue has (`special`)."""
from glue.scipy import special

__all__ = ["special"]
