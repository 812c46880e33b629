"""`sage-jax experiment`: the SaGE paper's experiments as configs (Tables 1-4, Figures 3-4), their
statistics (bootstrap intervals, correlations, Krippendorff's alpha) and the multiple-choice
accuracy of local causal LMs as lm-evaluation-harness computes it."""
