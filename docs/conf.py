"""Sphinx configuration: the Markdown pages under docs/ (MyST), built with warnings as errors in CI."""

project = "MaxKernel"
author = "MaxKernel developers"
extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3
html_theme = "alabaster"
html_static_path = ["_static"]
html_theme_options = {"page_width": "1200px", "sidebar_width": "240px"}
