"""JAX programs that run on glue by their imports alone (see README.md, "Examples")."""
