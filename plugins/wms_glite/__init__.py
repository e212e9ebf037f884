"""The wms_glite plugin package."""
