"""What the tests share: fixtures' helpers, fault tools, and the property tests' Hypothesis profile and strategies."""
