"""Tests of the worker-side handlers."""
