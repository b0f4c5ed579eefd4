"""Simulated users for tests and benchmarks: what they like and how they chat and rate."""
