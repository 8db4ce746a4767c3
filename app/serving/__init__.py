"""Served drafters: endpoints, their scrapes and windows, the served series the charts read."""
