__all__ = ['ttypes', 'constants', 'ExternalService']
