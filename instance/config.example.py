# Copy to instance/config.py to configure this deployment. Plain Python; upper-case names only.
# Environment variables (see README "Configuration") override anything set here.

# DATABASE_URL equivalent:
# SQLALCHEMY_DATABASE_URI = "postgresql+psycopg://rlhf:secret@localhost/rlhf"

# Start from a hub model instead of the embedded one (needs internet on first start):
# RLHF_BASE_MODEL = "gpt2"

# RLHF_DEVICE = "auto"          # auto | cpu | cuda
# RLHF_MAX_NEW_TOKENS = 80
# RLHF_TEMPERATURE = 0.8
# RLHF_TOP_P = 0.95
