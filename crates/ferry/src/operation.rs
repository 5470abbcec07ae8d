//! [`Operation`]: what the four operations have in common, for code that
//! handles any of them.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use ferry_proto::{OperationKind, OperationStatus, RdmaMetadata};

use crate::descriptor::Descriptor;
use crate::error::Result;
use crate::kind::TransportKind;
use crate::op::{ReadOperation, ReadableOperation, WritableOperation, WriteOperation};

mod sealed {
    /// Only this crate's four operations implement [`Operation`](super::Operation).
    pub trait Sealed {}
}

/// Any of the four operations: [`ReadableOperation`], [`WritableOperation`],
/// [`ReadOperation`] and [`WriteOperation`], for code that waits for,
/// cancels or reports on operations whatever their kind.
///
/// `'a` is the lifetime of the operation's [`Descriptor`]s (`'static` for
/// owned memory). The trait is object safe: `Box<dyn Operation<'a> + 'a>`
/// holds any operation (`Box<dyn Operation<'static>>` an operation on owned
/// memory), and it is `Send` and `Sync`, so that a task can own it.
///
/// Each method does what the operation's own method of the same name does;
/// on a value of a concrete type those are the ones called, and the waits
/// here only box their future (a trait object cannot return an unnamed
/// one). [`kind`](Self::kind), [`is_passive`](Self::is_passive) and
/// [`metadata`](Self::metadata) tell the four apart. The trait is sealed:
/// only the four operations implement it.
///
/// ```
/// use ferry::{Connector, Descriptor, Operation, OperationKind, OperationStatus};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> ferry::Result<()> {
/// let prefill = Connector::builder().listen("127.0.0.1:0".parse().unwrap()).build().await?;
/// let decode = Connector::builder().listen("127.0.0.1:0".parse().unwrap()).build().await?;
///
/// let readable = prefill.create_readable(vec![Descriptor::from_vec(vec![7u8; 4096])]).await?;
/// let read = decode
///     .begin_read(readable.metadata(), vec![Descriptor::from_vec(vec![0u8; 4096])])
///     .await?;
///
/// // Both sides of the transfer, handled alike.
/// let ops: Vec<Box<dyn Operation<'static>>> = vec![Box::new(readable), Box::new(read)];
/// for op in &ops {
///     op.wait_for_completion().await?;
///     assert_eq!(op.status(), OperationStatus::Complete);
///     assert_eq!(op.kind(), OperationKind::Read);
///     // Only the passive side has metadata to hand out.
///     assert_eq!(op.metadata().is_some(), op.is_passive());
/// }
/// for op in ops {
///     let bufs = op.into_descriptors();
///     assert!(bufs[0].as_slice().unwrap().iter().all(|&b| b == 7));
/// }
/// # Ok(()) }
/// ```
pub trait Operation<'a>: sealed::Sealed + fmt::Debug + Send + Sync {
    /// What the operation does with the remote's memory:
    /// [`OperationKind::Read`] for a readable and a read,
    /// [`OperationKind::Write`] for a writable and a write.
    fn kind(&self) -> OperationKind;

    /// Whether this side exposes its memory to the remote (a readable or a
    /// writable) rather than starting the transfer (a read or a write).
    fn is_passive(&self) -> bool;

    /// The current state.
    fn status(&self) -> OperationStatus;

    /// Waits until the operation ends: `Ok(())` when complete; the cause
    /// when it was cancelled (by either side) or failed.
    fn wait_for_completion(&self) -> Pin<Box<dyn Future<Output = Result<()>> + Send + '_>>;

    /// Like [`wait_for_completion`](Self::wait_for_completion), but gives up
    /// with [`Error::Timeout`](crate::Error::Timeout) after `timeout`. The
    /// operation itself goes on; cancel or drop it to stop it.
    fn wait_for_completion_timeout(
        &self,
        timeout: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<()>> + Send + '_>>;

    /// Cancels the operation unless it has already ended; the remote is
    /// told. When this returns, Ferry starts no further access to the
    /// memory; see the operations' own `cancel` ([`ReadOperation::cancel`])
    /// for a copy still in flight, and for the case where the remote
    /// decides the outcome.
    fn cancel(&self);

    /// The transport that carried (or is carrying) the bytes, once known.
    fn transport(&self) -> Option<TransportKind>;

    /// The metadata to hand to the remote worker: `Some` for a readable or
    /// a writable, `None` for a read or a write.
    fn metadata(&self) -> Option<&RdmaMetadata>;

    /// Whether the operation has ended and is done with its memory; see
    /// [`ReadOperation::is_released`].
    fn is_released(&self) -> bool;

    /// The descriptors, once the operation has ended (`None` before); see
    /// [`ReadOperation::descriptors`].
    fn descriptors(&self) -> Option<&[Descriptor<'a>]>;

    /// Takes the descriptors back, cancelling the operation if it has not
    /// ended; see [`ReadOperation::into_descriptors`] for the cases where
    /// this waits.
    fn into_descriptors(self: Box<Self>) -> Vec<Descriptor<'a>>;
}

/// Implements [`Operation`] for `$op` from its own public methods.
macro_rules! operation {
    ($op:ident, $kind:ident, $side:ident) => {
        impl sealed::Sealed for $op<'_> {}

        impl<'a> Operation<'a> for $op<'a> {
            fn kind(&self) -> OperationKind {
                OperationKind::$kind
            }

            operation!(@side $op, $side);

            fn status(&self) -> OperationStatus {
                $op::status(self)
            }

            fn wait_for_completion(
                &self,
            ) -> Pin<Box<dyn Future<Output = Result<()>> + Send + '_>> {
                Box::pin($op::wait_for_completion(self))
            }

            fn wait_for_completion_timeout(
                &self,
                timeout: Duration,
            ) -> Pin<Box<dyn Future<Output = Result<()>> + Send + '_>> {
                Box::pin($op::wait_for_completion_timeout(self, timeout))
            }

            fn cancel(&self) {
                $op::cancel(self)
            }

            fn transport(&self) -> Option<TransportKind> {
                $op::transport(self)
            }

            fn is_released(&self) -> bool {
                $op::is_released(self)
            }

            fn descriptors(&self) -> Option<&[Descriptor<'a>]> {
                $op::descriptors(self)
            }

            fn into_descriptors(self: Box<Self>) -> Vec<Descriptor<'a>> {
                $op::into_descriptors(*self)
            }
        }
    };
    (@side $op:ident, passive) => {
        fn is_passive(&self) -> bool {
            true
        }

        fn metadata(&self) -> Option<&RdmaMetadata> {
            Some($op::metadata(self))
        }
    };
    (@side $op:ident, active) => {
        fn is_passive(&self) -> bool {
            false
        }

        fn metadata(&self) -> Option<&RdmaMetadata> {
            None
        }
    };
}

operation!(ReadableOperation, Read, passive);
operation!(WritableOperation, Write, passive);
operation!(ReadOperation, Read, active);
operation!(WriteOperation, Write, active);

#[cfg(test)]
mod tests {
    use super::*;

    /// A task can own any operation.
    #[test]
    fn boxed_operations_are_send_and_sync() {
        fn send_sync<T: Send + Sync + ?Sized>() {}
        send_sync::<Box<dyn Operation<'static>>>();
        send_sync::<Box<dyn Operation<'_> + '_>>();
    }
}
