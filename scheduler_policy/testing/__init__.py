"""Test doubles at the engine's own boundary."""
