"""Several processes serving one model over one global device mesh (jax.distributed): see group.py."""
