"""Keystone neurons: probing and keystone-only fine-tuning."""

from .method import KeystoneMethod

__all__ = ["KeystoneMethod"]
