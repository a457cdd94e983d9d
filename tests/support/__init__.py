"""Helpers shared by test modules: servers, fakes, builders and values more than one test module uses.

Test modules import from here and from their own directory, never from another test module.
"""
