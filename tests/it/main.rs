//! The one integration-test binary: every module shares one throwaway Postgres
//! (`common::pg::Cluster::shared`) instead of starting a server per file.

mod common;
mod harness;
mod fencing;
mod relay;
mod raw_wire;
mod shutdown;
mod tools;
mod auth;
