//! Native Gymnasium-compatible environments.
