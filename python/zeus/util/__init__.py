"""Utilities: the cost metric, environment variables, logging, learning-rate scaling, HTTP."""
