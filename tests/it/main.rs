//! The one integration-test binary: every module shares one throwaway Postgres
//! (`common::pg::Cluster::shared`) instead of starting a server per file.

mod auth;
mod cli;
mod common;
mod demo;
mod docker;
mod drivers;
mod fencing;
mod harness;
mod jepsen;
mod lease;
mod raw_wire;
mod relay;
mod rewrite;
mod shutdown;
mod tools;
