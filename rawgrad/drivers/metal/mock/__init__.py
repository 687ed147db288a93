"""A mock Objective-C runtime with fake Metal classes, for Linux CI (see objc_fake.py)."""
