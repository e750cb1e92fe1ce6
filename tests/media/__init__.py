"""Tests of the worker-side byte stores."""
