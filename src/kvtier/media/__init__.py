"""Byte stores of the worker side: host memory, disk, remote."""
