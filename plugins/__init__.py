"""gridgate plugins shipped with the distribution."""
