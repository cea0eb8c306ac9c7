"""Interactive explorers (ipywidgets); update logic is plain Python, tested without a browser."""
