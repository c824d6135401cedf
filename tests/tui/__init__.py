"""Tests of the Textual TUI, driven headless against the fake chat service."""

from __future__ import annotations
