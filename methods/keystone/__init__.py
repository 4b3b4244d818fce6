"""Keystone neurons: probing and keystone-only fine-tuning (spec: shared/methods/keystone.md)."""

from .method import KeystoneMethod

__all__ = ["KeystoneMethod"]
