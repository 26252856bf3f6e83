# --- context_query_attention (cqa) ---
from .context_query_attention import context_query_attention, trilinear_similarity  # noqa: E402,F401
