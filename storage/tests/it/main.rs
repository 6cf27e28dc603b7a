//! Integration tests of the storage crate (one binary): properties of `apply` over random,
//! hostile command sequences, and of path parsing.

mod apply_props;
mod path_props;
