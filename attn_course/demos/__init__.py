"""Tiny synthetic tasks and models that train in seconds on a CPU, one module per lesson.

Import the lesson's module directly (this package imports nothing heavy on its own):

    from attn_course.demos.reverse import ReversalTask, train_reversal, reversal_attention   # lesson 01
"""
