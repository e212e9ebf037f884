"""The ARC CE backend (arcsub / arcstat / arckill / arcclean / arcget), and a private ARC CE for tests, benches and people."""
