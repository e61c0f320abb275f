"""Builders shared by the tests of several modules: the state a test starts from, made through the pages and
services as a customer or an operator would (an order placed, paid, ready; a container host; a hostile chain).
Test modules import from here, never from one another (tests/portal/test_test_layout.py checks it)."""
