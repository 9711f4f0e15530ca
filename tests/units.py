"""Sizes in bytes, for the tests' data and pools."""

KiB = 1 << 10
MiB = 1 << 20
