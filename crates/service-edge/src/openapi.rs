//! Editing generated OpenAPI documents: answers that come from a layer every route shares
//! (credentials, the JSON body reader, the store) are added once, to every operation, so that
//! a new operation gets them too.

use utoipa::openapi::path::Operation;
use utoipa::openapi::{ContentBuilder, OpenApi, Ref, ResponseBuilder};

/// Every operation of the document, with its path.
pub fn operations_mut(doc: &mut OpenApi) -> impl Iterator<Item = (&str, &mut Operation)> {
    doc.paths.paths.iter_mut().flat_map(|(path, item)| {
        [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.options,
            &mut item.head,
            &mut item.patch,
            &mut item.trace,
        ]
        .into_iter()
        .flatten()
        .map(move |operation| (path.as_str(), operation))
    })
}

/// Adds an answer for `status` whose JSON body is the `ErrorBody` schema, unless the
/// operation describes that status itself.
pub fn add_error_answer(operation: &mut Operation, status: &str, description: &str) {
    operation
        .responses
        .responses
        .entry(status.to_owned())
        .or_insert_with(|| {
            ResponseBuilder::new()
                .description(description)
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("ErrorBody")))
                        .build(),
                )
                .build()
                .into()
        });
}
