"""Fixtures of the reliability suite: the Google Drive stand-in `drive` lives in tests/conftest.py."""
