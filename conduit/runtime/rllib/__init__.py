"""Conduit under Ray RLlib (new API stack), through RLlib's public extension points only."""
