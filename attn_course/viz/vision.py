__all__: list[str] = []  # placeholder: the lesson-06 helper replaces this module
