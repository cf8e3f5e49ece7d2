"""placement strings and flags -> a plan."""
