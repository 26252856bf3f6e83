# --- context_query_attention (cqa) ---
from .context_query_attention import ContextQueryAttention, TrilinearSimilarity  # noqa: E402,F401
