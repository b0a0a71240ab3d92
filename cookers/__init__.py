"""Load-time code: tokenizing, packing and assembling samples; energon glue lives in `energon_*` modules."""
