//! The one integration-test binary: every module shares one throwaway Postgres
//! (`common::pg::Cluster::shared`) instead of starting a server per file.

mod common;
mod demo;
mod docker;
mod harness;
mod lease;
